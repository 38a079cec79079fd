//! Forwarding queries outside the zone to the configured resolvers, as a state machine: the
//! agent sends the datagrams it queues and hands back what arrives on its socket.
//!
//! Each query leaves with a fresh random id, goes to one resolver at a time (the next one
//! after [`FORWARD_TIMEOUT`]), and its answer is accepted only from a configured resolver,
//! with a pending id and the very question asked (byte for byte, so the case of the name
//! counts too). A query that came over TCP is sent with an EDNS buffer of
//! [`TCP_PAYLOAD`] bytes so that large answers are not truncated for a client that already
//! moved to TCP; the OPT record is taken out of the answer again if the client sent none.

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
    /// Resolvers tried so far.
    tries: usize,
    deadline: Instant,
}

/// Why an answer on the forwarding socket was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Not from a configured resolver, not a response, or unreadable.
    NotAnAnswer,
    /// No query of ours has this id.
    UnknownId,
    /// The question differs from the one asked (spoofed, or another query's answer).
    WrongQuestion,
}

/// The queries one namespace has at its resolvers.
pub struct Forwarder<A> {
    rng: rand::rngs::StdRng,
    resolvers: Vec<SocketAddr>,
    pending: HashMap<[u8; 2], Pending<A>>,
    out: VecDeque<(SocketAddr, Vec<u8>)>,
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
        let added_edns = tcp && message.edns.is_none();
        if added_edns {
            let mut edns = Edns::new();
            edns.set_max_payload(TCP_PAYLOAD);
            message.set_edns(edns);
        }
        let Ok(sent) = message.to_vec() else {
            return false;
        };
        self.out.push_back((resolver, sent.clone()));
        self.pending.insert(
            ours,
            Pending {
                asker,
                query: sent,
                question: message.queries,
                id,
                added_edns,
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

    /// A datagram from `from` on the forwarding socket: the answer to give `asker`, with
    /// its own id, or why it is not one.
    pub fn answer(&mut self, from: SocketAddr, datagram: &[u8]) -> Result<(A, Vec<u8>), Rejected> {
        if !self.resolvers.contains(&from) {
            return Err(Rejected::NotAnAnswer);
        }
        let mut answer = Message::from_vec(datagram).map_err(|_| Rejected::NotAnAnswer)?;
        if answer.metadata.message_type != hickory_proto::op::MessageType::Response {
            return Err(Rejected::NotAnAnswer);
        }
        let ours = answer.metadata.id.to_be_bytes();
        let p = self.pending.get(&ours).ok_or(Rejected::UnknownId)?;
        if !same_question(&p.question, &answer.queries) {
            return Err(Rejected::WrongQuestion);
        }
        let p = self.pending.remove(&ours).ok_or(Rejected::UnknownId)?;
        answer.metadata.id = u16::from_be_bytes(p.id);
        if p.added_edns {
            answer.edns = None;
        }
        let bytes = answer.to_vec().map_err(|_| Rejected::NotAnAnswer)?;
        Ok((p.asker, bytes))
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
                    self.out.push_back((next, p.query.clone()));
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

    /// The next datagram for a resolver.
    pub fn poll_datagram(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
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

    fn query(name: &str, id: u16) -> Vec<u8> {
        let mut q = Message::query();
        q.metadata.id = id;
        q.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        q.to_vec().unwrap()
    }

    /// What a resolver answers to `sent`.
    fn resolve(sent: &[u8], rcode: ResponseCode) -> Vec<u8> {
        let q = Message::from_vec(sent).unwrap();
        let mut r = Message::response(q.metadata.id, OpCode::Query);
        r.metadata.response_code = rcode;
        r.edns = q.edns.clone();
        for question in q.queries {
            r.add_answer(Record::from_rdata(
                question.name().clone(),
                60,
                RData::A(A(Ipv4Addr::new(192, 0, 2, 77))),
            ));
            r.add_query(question);
        }
        r.to_vec().unwrap()
    }

    fn forwarder() -> Forwarder<u8> {
        Forwarder::new(vec![R1.parse().unwrap(), R2.parse().unwrap()], [3; 32])
    }

    #[test]
    fn the_answer_goes_back_with_the_askers_id() {
        let mut f = forwarder();
        let t = Instant::now();
        assert!(f.forward(&query("Example.com.", 0x1234), 7, false, t));
        let (to, sent) = f.poll_datagram().unwrap();
        assert_eq!(to, R1.parse().unwrap());
        let ours = Message::from_vec(&sent).unwrap();
        assert!(ours.edns.is_none(), "a UDP query goes as it came");
        let (asker, answer) = f
            .answer(to, &resolve(&sent, ResponseCode::NoError))
            .unwrap();
        let answer = Message::from_vec(&answer).unwrap();
        assert_eq!((asker, answer.metadata.id), (7, 0x1234));
        assert_eq!(answer.answers.len(), 1);
        // Answered once only.
        assert_eq!(
            f.answer(to, &resolve(&sent, ResponseCode::NoError)),
            Err(Rejected::UnknownId)
        );
    }

    #[test]
    fn spoofed_and_stray_answers_are_refused() {
        let mut f = forwarder();
        let t = Instant::now();
        assert!(f.forward(&query("example.com.", 1), 7, false, t));
        let (to, sent) = f.poll_datagram().unwrap();
        let good = resolve(&sent, ResponseCode::NoError);
        // From someone who is not a resolver.
        assert_eq!(
            f.answer("198.51.100.1:53".parse().unwrap(), &good),
            Err(Rejected::NotAnAnswer)
        );
        // Another question under the right id (the case of a letter is enough).
        let mut other = Message::from_vec(&sent).unwrap();
        other.queries[0] = Query::query(Name::from_ascii("EXAMPLE.com.").unwrap(), RecordType::A);
        let other = resolve(&other.to_vec().unwrap(), ResponseCode::NoError);
        assert_eq!(f.answer(to, &other), Err(Rejected::WrongQuestion));
        // A query, not an answer; junk.
        assert_eq!(f.answer(to, &sent), Err(Rejected::NotAnAnswer));
        assert_eq!(f.answer(to, b"junk"), Err(Rejected::NotAnAnswer));
        // The real answer still gets through.
        assert_eq!(f.answer(to, &good).map(|(a, _)| a), Ok(7));
    }

    #[test]
    fn a_silent_resolver_passes_the_query_on_then_it_fails() {
        let mut f = forwarder();
        let t = Instant::now();
        assert!(f.forward(&query("example.com.", 0xabcd), 3, false, t));
        let (_, first) = f.poll_datagram().unwrap();
        assert!(f.handle_timeout(t + FORWARD_TIMEOUT / 2).is_empty());
        assert!(f.handle_timeout(t + FORWARD_TIMEOUT).is_empty());
        let (to, second) = f.poll_datagram().unwrap();
        assert_eq!((to, &second), (R2.parse().unwrap(), &first));
        // The second resolver may answer; or, silent too, the query fails.
        let failed = f.handle_timeout(t + 2 * FORWARD_TIMEOUT);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].0, 3);
        assert_eq!(Message::from_vec(&failed[0].1).unwrap().metadata.id, 0xabcd);
        assert!(f.poll_datagram().is_none());
    }

    #[test]
    fn tcp_clients_get_large_answers_without_an_opt_they_never_sent() {
        let mut f = forwarder();
        let t = Instant::now();
        assert!(f.forward(&query("big.example.", 9), 1, true, t));
        let (to, sent) = f.poll_datagram().unwrap();
        let ours = Message::from_vec(&sent).unwrap();
        assert_eq!(ours.edns.as_ref().map(Edns::max_payload), Some(TCP_PAYLOAD));
        let (_, answer) = f
            .answer(to, &resolve(&sent, ResponseCode::NoError))
            .unwrap();
        assert!(Message::from_vec(&answer).unwrap().edns.is_none());
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
