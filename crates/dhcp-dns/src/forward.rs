//! Forwarding queries outside the zone to the configured resolvers, as a state machine: the
//! agent sends the [`Transmit`]s it queues and hands back what arrives for each.
//!
//! RFC 5452 (resilience against forged answers): each query leaves with a fresh random id
//! and, over UDP, from a socket of its own on a port the OS picks at random, which the agent
//! connects to the resolver and closes after the answer. An answer is accepted only from the
//! resolver the query was sent to (address and port), on the socket that carried the query
//! (the agent names it by the query's id), with that id and the very question asked (byte
//! for byte, so the case of the name counts too). Each query goes to one resolver at a time
//! (the next one after [`FORWARD_TIMEOUT`]).
//!
//! TCP (RFC 7766): a query that came over TCP goes to the resolver over TCP, and a UDP
//! answer with the TC bit set is not passed on: the query is asked again over TCP, so the
//! asker gets the whole answer (cut to what a UDP asker said it can take, 512 bytes without
//! EDNS, as RFC 6891 6.2.3 asks). A query that came over TCP asks for an EDNS buffer of
//! [`TCP_PAYLOAD`] bytes; the OPT record is taken out of the answer again if the client
//! sent none.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, Query};

/// How long one resolver has to answer before the next one is asked.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(2);

/// Queries at the resolvers at once; beyond, new ones are refused (the caller answers
/// SERVFAIL).
pub const MAX_FORWARDS: usize = 256;

/// The EDNS buffer size asked for on behalf of a TCP client.
pub const TCP_PAYLOAD: u16 = 4096;

/// The largest UDP answer for a client that sent no EDNS record (RFC 1035 4.2.1).
pub const PLAIN_UDP_PAYLOAD: u16 = 512;

/// A query for a resolver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The resolver.
    pub to: SocketAddr,
    /// Over TCP (length-prefixed on a connection of its own), or UDP (from a socket of its
    /// own, on a random port).
    pub tcp: bool,
    /// The query's id: hand it back with what arrives for this transmit.
    pub id: [u8; 2],
    /// The query as it goes out.
    pub query: Vec<u8>,
}

struct Pending<A> {
    asker: A,
    /// The query as sent (our id).
    query: Vec<u8>,
    /// The question, to match the answer against.
    question: Vec<Query>,
    /// The asker's id.
    id: [u8; 2],
    /// Whether we added the OPT record (it is removed from the answer).
    added_edns: bool,
    /// The largest answer the asker takes over UDP (`None`: the asker is on TCP).
    udp_limit: Option<usize>,
    /// Where the query is now, and over which transport.
    to: SocketAddr,
    tcp: bool,
    /// Resolvers tried so far.
    tries: usize,
    deadline: Instant,
}

/// Why an answer was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Not from the resolver the query went to, not a response, or unreadable.
    NotAnAnswer,
    /// No query of ours has this id, or it came on another query's socket.
    UnknownId,
    /// The question differs from the one asked (spoofed, or another query's answer).
    WrongQuestion,
}

/// What an accepted answer leads to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken<A> {
    /// The answer for `A`, with its own id.
    Answer(A, Vec<u8>),
    /// Truncated over UDP: the query is asked again over TCP (a [`Transmit`] is queued).
    RetryOverTcp,
}

/// The queries one namespace has at its resolvers.
pub struct Forwarder<A> {
    rng: rand::rngs::StdRng,
    resolvers: Vec<SocketAddr>,
    pending: HashMap<[u8; 2], Pending<A>>,
    out: VecDeque<Transmit>,
}

impl<A: Copy> Forwarder<A> {
    /// Forwards to `resolvers`, in this order. `seed` seeds the query ids (seed it from
    /// the OS: a blind spoofer must not predict them).
    pub fn new(resolvers: Vec<SocketAddr>, seed: [u8; 32]) -> Self {
        Self {
            rng: rand::SeedableRng::from_seed(seed),
            resolvers,
            pending: HashMap::new(),
            out: VecDeque::new(),
        }
    }

    /// The configured resolvers.
    pub fn resolvers(&self) -> &[SocketAddr] {
        &self.resolvers
    }

    /// Stops forwarding to the resolvers `keep` says no to (e.g. the service address
    /// itself, which would send queries round in a loop).
    pub fn retain_resolvers(&mut self, keep: impl Fn(&SocketAddr) -> bool) {
        self.resolvers.retain(keep);
    }

    /// Sends `query` (from `asker`, over TCP if `tcp`) to the first resolver. `false` if it
    /// cannot be forwarded (no resolvers, too many pending, unreadable): answer SERVFAIL.
    pub fn forward(&mut self, query: &[u8], asker: A, tcp: bool, now: Instant) -> bool {
        let Some(&resolver) = self.resolvers.first() else {
            return false;
        };
        if self.pending.len() >= MAX_FORWARDS {
            return false;
        }
        let Ok(mut message) = Message::from_vec(query) else {
            return false;
        };
        let id = message.metadata.id.to_be_bytes();
        let Some(ours) = self.fresh_id() else {
            return false;
        };
        message.metadata.id = u16::from_be_bytes(ours);
        let udp_limit = (!tcp).then(|| {
            let asked = message.edns.as_ref().map_or(0, Edns::max_payload);
            usize::from(asked.max(PLAIN_UDP_PAYLOAD))
        });
        let added_edns = tcp && message.edns.is_none();
        if added_edns {
            let mut edns = Edns::new();
            edns.set_max_payload(TCP_PAYLOAD);
            message.set_edns(edns);
        }
        let Ok(sent) = message.to_vec() else {
            return false;
        };
        self.out.push_back(Transmit {
            to: resolver,
            tcp,
            id: ours,
            query: sent.clone(),
        });
        self.pending.insert(
            ours,
            Pending {
                asker,
                query: sent,
                question: message.queries,
                id,
                added_edns,
                udp_limit,
                to: resolver,
                tcp,
                tries: 1,
                deadline: now + FORWARD_TIMEOUT,
            },
        );
        true
    }

    /// A random id no pending query uses.
    fn fresh_id(&mut self) -> Option<[u8; 2]> {
        use rand::Rng as _;
        for _ in 0..64 {
            let mut id = [0u8; 2];
            self.rng.fill_bytes(&mut id);
            if !self.pending.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }

    /// `message` arrived from `from` for the [`Transmit`] with id `sent` (over TCP if
    /// `tcp`): the answer to give its asker, a retry over TCP, or why it is not taken.
    pub fn answer(
        &mut self,
        now: Instant,
        sent: [u8; 2],
        tcp: bool,
        from: SocketAddr,
        message: &[u8],
    ) -> Result<Taken<A>, Rejected> {
        let mut answer = Message::from_vec(message).map_err(|_| Rejected::NotAnAnswer)?;
        if answer.metadata.message_type != hickory_proto::op::MessageType::Response {
            return Err(Rejected::NotAnAnswer);
        }
        let ours = answer.metadata.id.to_be_bytes();
        if ours != sent {
            return Err(Rejected::UnknownId);
        }
        let p = self.pending.get_mut(&ours).ok_or(Rejected::UnknownId)?;
        if from != p.to || tcp != p.tcp {
            return Err(Rejected::NotAnAnswer);
        }
        if !same_question(&p.question, &answer.queries) {
            return Err(Rejected::WrongQuestion);
        }
        if answer.metadata.truncation && !tcp {
            // RFC 7766 5: the whole answer is there over TCP, from the same resolver.
            p.tcp = true;
            p.deadline = now + FORWARD_TIMEOUT;
            self.out.push_back(Transmit {
                to: p.to,
                tcp: true,
                id: ours,
                query: p.query.clone(),
            });
            return Ok(Taken::RetryOverTcp);
        }
        let p = self.pending.remove(&ours).ok_or(Rejected::UnknownId)?;
        answer.metadata.id = u16::from_be_bytes(p.id);
        if p.added_edns {
            answer.edns = None;
        }
        let mut bytes = answer.to_vec().map_err(|_| Rejected::NotAnAnswer)?;
        if p.udp_limit.is_some_and(|limit| bytes.len() > limit) {
            bytes = crate::dns::truncated(&bytes).ok_or(Rejected::NotAnAnswer)?;
        }
        Ok(Taken::Answer(p.asker, bytes))
    }

    /// Timers: a query whose resolver did not answer in time goes to the next one; one that
    /// every resolver let down comes back (with the asker's id) for a SERVFAIL.
    pub fn handle_timeout(&mut self, now: Instant) -> Vec<(A, Vec<u8>)> {
        let due: Vec<[u8; 2]> = self
            .pending
            .iter()
            .filter(|(_, p)| now >= p.deadline)
            .map(|(id, _)| *id)
            .collect();
        let mut failed = Vec::new();
        for id in due {
            let Some(mut p) = self.pending.remove(&id) else {
                continue;
            };
            match self.resolvers.get(p.tries) {
                Some(&next) => {
                    p.tries += 1;
                    p.deadline = now + FORWARD_TIMEOUT;
                    p.to = next;
                    // Back to the transport the asker came over.
                    p.tcp = p.udp_limit.is_none();
                    self.out.push_back(Transmit {
                        to: next,
                        tcp: p.tcp,
                        id,
                        query: p.query.clone(),
                    });
                    self.pending.insert(id, p);
                }
                None => {
                    let mut query = p.query;
                    if let Some(head) = query.get_mut(..2) {
                        head.copy_from_slice(&p.id);
                    }
                    failed.push((p.asker, query));
                }
            }
        }
        failed
    }

    /// When [`Forwarder::handle_timeout`] next has work: the earliest resolver deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.pending.values().map(|p| p.deadline).min()
    }

    /// The next query for a resolver.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.pop_front()
    }
}

/// The same questions, names compared byte for byte (case included).
fn same_question(asked: &[Query], answered: &[Query]) -> bool {
    asked.len() == answered.len()
        && asked.iter().zip(answered).all(|(a, b)| {
            a.query_type() == b.query_type()
                && a.query_class() == b.query_class()
                && a.name().to_ascii() == b.name().to_ascii()
        })
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests start the clock
mod tests {
    use super::*;
    use hickory_proto::op::{OpCode, ResponseCode};
    use hickory_proto::rr::rdata::A;
    use hickory_proto::rr::{Name, RData, Record, RecordType};
    use std::net::Ipv4Addr;

    const R1: &str = "192.0.2.53:53";
    const R2: &str = "192.0.2.54:53";

    fn r1() -> SocketAddr {
        R1.parse().unwrap()
    }

    fn query(name: &str, id: u16) -> Vec<u8> {
        let mut q = Message::query();
        q.metadata.id = id;
        q.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        q.to_vec().unwrap()
    }

    /// What a resolver answers to `sent`: `records` A records, truncated (no records, TC
    /// set) if `cut`.
    fn resolve_with(sent: &[u8], records: u8, cut: bool) -> Vec<u8> {
        let q = Message::from_vec(sent).unwrap();
        let mut r = Message::response(q.metadata.id, OpCode::Query);
        r.metadata.response_code = ResponseCode::NoError;
        r.metadata.truncation = cut;
        r.edns = q.edns.clone();
        for question in q.queries {
            for i in 0..if cut { 0 } else { records } {
                r.add_answer(Record::from_rdata(
                    question.name().clone(),
                    60,
                    RData::A(A(Ipv4Addr::new(192, 0, 2, i))),
                ));
            }
            r.add_query(question);
        }
        r.to_vec().unwrap()
    }

    fn resolve(sent: &[u8]) -> Vec<u8> {
        resolve_with(sent, 1, false)
    }

    fn forwarder() -> Forwarder<u8> {
        Forwarder::new(vec![R1.parse().unwrap(), R2.parse().unwrap()], [3; 32])
    }

    fn answered(t: Result<Taken<u8>, Rejected>) -> (u8, Message) {
        match t {
            Ok(Taken::Answer(asker, bytes)) => (asker, Message::from_vec(&bytes).unwrap()),
            other => panic!("not an answer: {other:?}"),
        }
    }

    #[test]
    fn the_answer_goes_back_with_the_askers_id() {
        let mut f = forwarder();
        let t = Instant::now();
        assert!(f.forward(&query("Example.com.", 0x1234), 7, false, t));
        let tx = f.poll_transmit().unwrap();
        assert_eq!((tx.to, tx.tcp), (r1(), false));
        let ours = Message::from_vec(&tx.query).unwrap();
        assert_eq!(ours.metadata.id.to_be_bytes(), tx.id);
        assert!(ours.edns.is_none(), "a UDP query goes as it came");
        let (asker, answer) = answered(f.answer(t, tx.id, false, tx.to, &resolve(&tx.query)));
        assert_eq!((asker, answer.metadata.id), (7, 0x1234));
        assert_eq!(answer.answers.len(), 1);
        // Answered once only.
        assert_eq!(
            f.answer(t, tx.id, false, tx.to, &resolve(&tx.query)),
            Err(Rejected::UnknownId)
        );
    }

    #[test]
    fn each_query_has_a_fresh_random_id() {
        let mut f = forwarder();
        let t = Instant::now();
        let mut ids = std::collections::HashSet::new();
        for _ in 0..100 {
            // The same asker's id every time: ours differ anyway.
            assert!(f.forward(&query("example.com.", 1), 1, false, t));
            let tx = f.poll_transmit().unwrap();
            assert!(ids.insert(tx.id), "id {:?} used twice", tx.id);
        }
        // Another seed, other ids: they come from the seeded RNG, not a counter.
        let first = |seed| {
            let mut g: Forwarder<u8> = Forwarder::new(vec![r1()], seed);
            assert!(g.forward(&query("example.com.", 1), 1, false, t));
            g.poll_transmit().unwrap().id
        };
        assert_eq!(first([3; 32]), first([3; 32]));
        assert_ne!(first([3; 32]), first([9; 32]));
    }

    #[test]
    fn spoofed_and_stray_answers_are_refused() {
        let mut f = forwarder();
        let t = Instant::now();
        assert!(f.forward(&query("example.com.", 1), 7, false, t));
        assert!(f.forward(&query("example.com.", 2), 8, false, t));
        let tx = f.poll_transmit().unwrap();
        let other_tx = f.poll_transmit().unwrap();
        let good = resolve(&tx.query);
        // From someone who is not the resolver; from the resolver's address on another
        // port; from the second resolver, which was not asked.
        for from in ["198.51.100.1:53", "192.0.2.53:5353", R2] {
            assert_eq!(
                f.answer(t, tx.id, false, from.parse().unwrap(), &good),
                Err(Rejected::NotAnAnswer),
                "{from}"
            );
        }
        // The right answer on another query's socket (a spoofer who guessed that port).
        assert_eq!(
            f.answer(t, other_tx.id, false, tx.to, &good),
            Err(Rejected::UnknownId)
        );
        // Over TCP, when it went over UDP.
        assert_eq!(
            f.answer(t, tx.id, true, tx.to, &good),
            Err(Rejected::NotAnAnswer)
        );
        // Another question under the right id (the case of a letter is enough).
        let mut other = Message::from_vec(&tx.query).unwrap();
        other.queries[0] = Query::query(Name::from_ascii("EXAMPLE.com.").unwrap(), RecordType::A);
        let other = resolve(&other.to_vec().unwrap());
        assert_eq!(
            f.answer(t, tx.id, false, tx.to, &other),
            Err(Rejected::WrongQuestion)
        );
        // A query, not an answer; junk.
        assert_eq!(
            f.answer(t, tx.id, false, tx.to, &tx.query),
            Err(Rejected::NotAnAnswer)
        );
        assert_eq!(
            f.answer(t, tx.id, false, tx.to, b"junk"),
            Err(Rejected::NotAnAnswer)
        );
        // The real answer still gets through.
        assert_eq!(answered(f.answer(t, tx.id, false, tx.to, &good)).0, 7);
    }

    #[test]
    fn a_truncated_udp_answer_is_asked_again_over_tcp() {
        let mut f = forwarder();
        let t = Instant::now();
        // The client sent EDNS with a 1232-byte buffer.
        let mut q = Message::from_vec(&query("big.example.", 0x4242)).unwrap();
        let mut edns = Edns::new();
        edns.set_max_payload(1232);
        q.set_edns(edns);
        assert!(f.forward(&q.to_vec().unwrap(), 5, false, t));
        let udp = f.poll_transmit().unwrap();
        assert!(!udp.tcp);
        let cut = resolve_with(&udp.query, 0, true);
        assert_eq!(
            f.answer(t, udp.id, false, udp.to, &cut),
            Ok(Taken::RetryOverTcp)
        );
        let tcp = f.poll_transmit().unwrap();
        assert_eq!((tcp.to, tcp.tcp, tcp.id), (udp.to, true, udp.id));
        assert_eq!(tcp.query, udp.query);
        // A second truncated copy over UDP is no longer taken: the query is on TCP now.
        assert_eq!(
            f.answer(t, udp.id, false, udp.to, &cut),
            Err(Rejected::NotAnAnswer)
        );
        // 60 records (about 1 kB) over TCP: the client gets them all, with its id.
        let full = resolve_with(&tcp.query, 60, false);
        let (asker, answer) = answered(f.answer(t, tcp.id, true, tcp.to, &full));
        assert_eq!((asker, answer.metadata.id), (5, 0x4242));
        assert_eq!(answer.answers.len(), 60);
        assert!(!answer.metadata.truncation);
    }

    #[test]
    fn a_client_without_edns_gets_at_most_512_bytes_over_udp() {
        let mut f = forwarder();
        let t = Instant::now();
        assert!(f.forward(&query("big.example.", 0x99), 5, false, t));
        let udp = f.poll_transmit().unwrap();
        assert_eq!(
            f.answer(t, udp.id, false, udp.to, &resolve_with(&udp.query, 0, true)),
            Ok(Taken::RetryOverTcp)
        );
        let tcp = f.poll_transmit().unwrap();
        let full = resolve_with(&tcp.query, 60, false);
        assert!(full.len() > 512);
        let (_, answer) = answered(f.answer(t, tcp.id, true, tcp.to, &full));
        // Too large for it: header and question with TC, and it asks us over TCP.
        assert!(answer.metadata.truncation);
        assert!(answer.answers.is_empty());
        assert_eq!(answer.queries.len(), 1);
    }

    #[test]
    fn a_silent_resolver_passes_the_query_on_then_it_fails() {
        let mut f = forwarder();
        let t = Instant::now();
        assert!(f.forward(&query("example.com.", 0xabcd), 3, false, t));
        let first = f.poll_transmit().unwrap();
        assert!(f.handle_timeout(t + FORWARD_TIMEOUT / 2).is_empty());
        assert!(f.handle_timeout(t + FORWARD_TIMEOUT).is_empty());
        let second = f.poll_transmit().unwrap();
        assert_eq!(
            (second.to, &second.query, second.tcp),
            (R2.parse().unwrap(), &first.query, false)
        );
        // The first resolver's late answer is no longer taken: the query is at the second.
        assert_eq!(
            f.answer(t, first.id, false, first.to, &resolve(&first.query)),
            Err(Rejected::NotAnAnswer)
        );
        // The second resolver may answer; or, silent too, the query fails.
        let failed = f.handle_timeout(t + 2 * FORWARD_TIMEOUT);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].0, 3);
        assert_eq!(Message::from_vec(&failed[0].1).unwrap().metadata.id, 0xabcd);
        assert!(f.poll_transmit().is_none());
    }

    #[test]
    fn tcp_clients_go_over_tcp_with_large_answers_and_no_opt_they_never_sent() {
        let mut f = forwarder();
        let t = Instant::now();
        assert!(f.forward(&query("big.example.", 9), 1, true, t));
        let tx = f.poll_transmit().unwrap();
        assert!(tx.tcp, "a TCP asker's query goes over TCP");
        let ours = Message::from_vec(&tx.query).unwrap();
        assert_eq!(ours.edns.as_ref().map(Edns::max_payload), Some(TCP_PAYLOAD));
        let (_, answer) =
            answered(f.answer(t, tx.id, true, tx.to, &resolve_with(&tx.query, 60, false)));
        assert!(answer.edns.is_none());
        assert_eq!(answer.answers.len(), 60, "never cut for a TCP asker");
        // The next resolver is asked over TCP too.
        assert!(f.forward(&query("big.example.", 10), 1, true, t));
        let _ = f.poll_transmit().unwrap();
        assert!(f.handle_timeout(t + FORWARD_TIMEOUT).is_empty());
        let next = f.poll_transmit().unwrap();
        assert_eq!((next.to, next.tcp), (R2.parse().unwrap(), true));
    }

    #[test]
    fn the_service_address_is_never_a_resolver() {
        let mut f = forwarder();
        f.retain_resolvers(|r| r.ip() != "192.0.2.53".parse::<std::net::IpAddr>().unwrap());
        assert_eq!(f.resolvers(), &[R2.parse::<SocketAddr>().unwrap()]);
    }

    #[test]
    fn bounds_and_no_resolvers() {
        let t = Instant::now();
        let mut none: Forwarder<u8> = Forwarder::new(Vec::new(), [4; 32]);
        assert!(!none.forward(&query("example.com.", 1), 1, false, t));
        let mut f = forwarder();
        for i in 0..MAX_FORWARDS {
            assert!(f.forward(&query("example.com.", i as u16), 1, false, t));
        }
        assert!(!f.forward(&query("example.com.", 1), 1, false, t));
        assert!(!f.forward(b"junk", 1, false, t));
    }
}
