//! The virtual DNS server of one namespace, as a pure function of a query and a name store.
//!
//! Inside the namespace zone (`NAMESPACE.`): `HOST.NAMESPACE` answers the address of the
//! member or DHCP client that holds the name, IPOP's automatic names answer every owned
//! address (`C250005005.NAMESPACE` is 10.250.5.5: the last three octets, three digits
//! each), reverse names in the subnet answer PTR, and anything else in the zone is
//! NXDOMAIN. Outside the zone the query is forwarded to the configured resolvers, or refused
//! when there are none. Malformed queries get FORMERR when they carry a readable header,
//! and are dropped (counted) otherwise.
//!
//! Messages are parsed and built with `hickory-proto`; the store is the agent's view of the
//! names and addresses in the DHT ([`Names`]).

use std::net::Ipv4Addr;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, PTR};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use ipnet::Ipv4Net;

/// TTL of the answers (names move with their owners' leases).
pub const TTL: u32 = 60;

/// What the server knows about the namespace: the agent backs it with the DHT.
pub trait Names {
    /// The address of `host` (a lowercase label) in this namespace, if someone holds it.
    fn address_of(&self, host: &str) -> Option<Ipv4Addr>;
    /// The name (a label) held for `address`, if any.
    fn name_of(&self, address: Ipv4Addr) -> Option<String>;
    /// Whether some member owns `address` (automatic names exist only for those).
    fn is_owned(&self, address: Ipv4Addr) -> bool;
}

/// A namespace's DNS settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The zone: the namespace's name, e.g. `lab.`.
    pub zone: Name,
    /// The namespace subnet (reverse names and automatic names live in it).
    pub subnet: Ipv4Net,
    /// Whether queries outside the zone are forwarded (resolvers configured); otherwise
    /// they are refused.
    pub forward: bool,
}

/// What to do with a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Send this response back.
    Reply(Vec<u8>),
    /// Outside the zone: forward the query unchanged to the configured resolvers, and the
    /// response back to the asker.
    Forward,
    /// Unreadable: drop it (counted).
    Drop,
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Queries answered from the zone (NOERROR with or without records).
    pub answered: u64,
    /// NXDOMAIN answers.
    pub nxdomain: u64,
    /// Queries forwarded.
    pub forwarded: u64,
    /// REFUSED answers (outside the zone, no resolvers).
    pub refused: u64,
    /// FORMERR and NOTIMP answers.
    pub errors: u64,
    /// Queries dropped unread.
    pub dropped: u64,
}

/// One namespace's DNS server.
#[derive(Debug)]
pub struct Server {
    settings: Settings,
    zone: Name,
    stats: Stats,
}

impl Server {
    /// A server for `settings`.
    pub fn new(settings: Settings) -> Self {
        let zone = settings.zone.to_lowercase();
        Self {
            settings,
            zone,
            stats: Stats::default(),
        }
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Answers one query (a UDP payload, or a TCP message without its length prefix).
    pub fn handle(&mut self, query: &[u8], names: &impl Names) -> Answer {
        let request = match Message::from_vec(query) {
            Ok(m) => m,
            Err(_) => {
                // A readable id gets FORMERR; less than a header is dropped.
                let Some(id) = query.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]])) else {
                    self.stats.dropped += 1;
                    return Answer::Drop;
                };
                if query.len() < 12 || query[2] & 0x80 != 0 {
                    self.stats.dropped += 1;
                    return Answer::Drop;
                }
                self.stats.errors += 1;
                return self.encode(Message::error_msg(id, OpCode::Query, ResponseCode::FormErr));
            }
        };
        let id = request.metadata.id;
        if request.metadata.message_type != MessageType::Query {
            self.stats.dropped += 1;
            return Answer::Drop;
        }
        if request.metadata.op_code != OpCode::Query {
            self.stats.errors += 1;
            return self.encode(Message::error_msg(
                id,
                request.metadata.op_code,
                ResponseCode::NotImp,
            ));
        }
        let [query] = request.queries.as_slice() else {
            self.stats.errors += 1;
            return self.encode(Message::error_msg(id, OpCode::Query, ResponseCode::FormErr));
        };
        let name = query.name().to_lowercase();
        let qtype = query.query_type();
        let mut response = Message::response(id, OpCode::Query);
        response.metadata.recursion_desired = request.metadata.recursion_desired;
        response.metadata.recursion_available = self.settings.forward;
        response.add_query(query.clone());

        let reverse = reverse_address(&name).filter(|a| self.settings.subnet.contains(a));
        if let Some(address) = reverse {
            response.metadata.authoritative = true;
            let host = names
                .name_of(address)
                .or_else(|| names.is_owned(address).then(|| automatic_name(address)));
            let Some(host) = host.and_then(|h| self.in_zone(&h)) else {
                return self.nxdomain(response);
            };
            if matches!(qtype, RecordType::PTR | RecordType::ANY) {
                response.add_answer(Record::from_rdata(
                    query.name().clone(),
                    TTL,
                    RData::PTR(PTR(host)),
                ));
            }
            self.stats.answered += 1;
            return self.encode(response);
        }
        if !self.zone.zone_of(&name) {
            if self.settings.forward {
                self.stats.forwarded += 1;
                return Answer::Forward;
            }
            self.stats.refused += 1;
            response.metadata.response_code = ResponseCode::Refused;
            return self.encode(response);
        }
        response.metadata.authoritative = true;
        if name == self.zone {
            // The apex exists (it has no address).
            self.stats.answered += 1;
            return self.encode(response);
        }
        let address = (name.num_labels() == self.zone.num_labels() + 1)
            .then(|| name.iter().next())
            .flatten()
            .and_then(|label| std::str::from_utf8(label).ok())
            .and_then(|host| {
                names.address_of(host).or_else(|| {
                    automatic_address(host, self.settings.subnet).filter(|a| names.is_owned(*a))
                })
            });
        let Some(address) = address else {
            return self.nxdomain(response);
        };
        if matches!(qtype, RecordType::A | RecordType::ANY) {
            response.add_answer(Record::from_rdata(
                query.name().clone(),
                TTL,
                RData::A(A(address)),
            ));
        }
        // Other types of an existing name: NOERROR with no records (NODATA).
        self.stats.answered += 1;
        self.encode(response)
    }

    fn in_zone(&self, host: &str) -> Option<Name> {
        Name::from_ascii(host).ok()?.append_domain(&self.zone).ok()
    }

    fn nxdomain(&mut self, mut response: Message) -> Answer {
        self.stats.nxdomain += 1;
        response.metadata.response_code = ResponseCode::NXDomain;
        self.encode(response)
    }

    fn encode(&mut self, m: Message) -> Answer {
        match m.to_vec() {
            Ok(bytes) => Answer::Reply(bytes),
            Err(_) => {
                self.stats.dropped += 1;
                Answer::Drop
            }
        }
    }
}

/// IPOP's automatic name of an address: `C` and the last three octets, three digits each.
pub fn automatic_name(a: Ipv4Addr) -> String {
    let o = a.octets();
    format!("c{:03}{:03}{:03}", o[1], o[2], o[3])
}

/// The address an automatic name stands for in `subnet` (its first octet is the subnet's).
fn automatic_address(host: &str, subnet: Ipv4Net) -> Option<Ipv4Addr> {
    let digits = host.strip_prefix('c')?;
    if digits.len() != 9 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let octet = |i: usize| digits.get(i..i + 3)?.parse::<u8>().ok();
    let a = Ipv4Addr::new(
        subnet.network().octets()[0],
        octet(0)?,
        octet(3)?,
        octet(6)?,
    );
    subnet.contains(&a).then_some(a)
}

/// `d.c.b.a.in-addr.arpa.` -> a.b.c.d.
fn reverse_address(name: &Name) -> Option<Ipv4Addr> {
    let labels: Vec<&[u8]> = name.iter().collect();
    let [d, c, b, a, inaddr, arpa] = labels.as_slice() else {
        return None;
    };
    if !inaddr.eq_ignore_ascii_case(b"in-addr") || !arpa.eq_ignore_ascii_case(b"arpa") {
        return None;
    }
    let octet = |l: &[u8]| std::str::from_utf8(l).ok()?.parse::<u8>().ok();
    Some(Ipv4Addr::new(octet(a)?, octet(b)?, octet(c)?, octet(d)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use std::collections::HashMap;

    struct Store(HashMap<String, Ipv4Addr>);

    impl Names for Store {
        fn address_of(&self, host: &str) -> Option<Ipv4Addr> {
            self.0.get(host).copied()
        }
        fn name_of(&self, address: Ipv4Addr) -> Option<String> {
            self.0
                .iter()
                .find(|(_, a)| **a == address)
                .map(|(n, _)| n.clone())
        }
        fn is_owned(&self, address: Ipv4Addr) -> bool {
            self.0.values().any(|a| *a == address) || address == Ipv4Addr::new(10, 250, 5, 5)
        }
    }

    fn store() -> Store {
        Store(HashMap::from([(
            "web".to_string(),
            Ipv4Addr::new(10, 250, 0, 7),
        )]))
    }

    fn server(forward: bool) -> Server {
        Server::new(Settings {
            zone: Name::from_ascii("Lab.").unwrap(),
            subnet: "10.250.0.0/16".parse().unwrap(),
            forward,
        })
    }

    fn ask(s: &mut Server, name: &str, qtype: RecordType) -> Message {
        let mut q = Message::query();
        q.metadata.recursion_desired = true;
        q.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
        match s.handle(&q.to_vec().unwrap(), &store()) {
            Answer::Reply(bytes) => {
                let r = Message::from_vec(&bytes).unwrap();
                assert_eq!(r.metadata.id, q.metadata.id);
                assert_eq!(r.metadata.message_type, MessageType::Response);
                r
            }
            other => panic!("{name}: {other:?}"),
        }
    }

    fn a_of(r: &Message) -> Vec<Ipv4Addr> {
        r.answers
            .iter()
            .filter_map(|rec| match &rec.data {
                RData::A(A(a)) => Some(*a),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn names_automatic_names_and_reverse() {
        let mut s = server(false);
        let r = ask(&mut s, "web.lab.", RecordType::A);
        assert_eq!(r.metadata.response_code, ResponseCode::NoError);
        assert!(r.metadata.authoritative);
        assert_eq!(a_of(&r), vec![Ipv4Addr::new(10, 250, 0, 7)]);
        // Case does not matter.
        assert_eq!(
            a_of(&ask(&mut s, "WEB.LAB.", RecordType::A)),
            vec![Ipv4Addr::new(10, 250, 0, 7)]
        );
        // IPOP's automatic name of an owned address, and of one nobody owns.
        assert_eq!(automatic_name(Ipv4Addr::new(10, 250, 5, 5)), "c250005005");
        let r = ask(&mut s, "C250005005.lab.", RecordType::A);
        assert_eq!(a_of(&r), vec![Ipv4Addr::new(10, 250, 5, 5)]);
        let r = ask(&mut s, "c250005006.lab.", RecordType::A);
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
        // Unknown names, deeper names: NXDOMAIN. Another type of a known name: NODATA.
        for n in ["db.lab.", "x.web.lab.", "c25000500.lab."] {
            assert_eq!(
                ask(&mut s, n, RecordType::A).metadata.response_code,
                ResponseCode::NXDomain,
                "{n}"
            );
        }
        let r = ask(&mut s, "web.lab.", RecordType::AAAA);
        assert_eq!(
            (r.metadata.response_code, r.answers.len()),
            (ResponseCode::NoError, 0)
        );
        assert_eq!(
            ask(&mut s, "lab.", RecordType::A).metadata.response_code,
            ResponseCode::NoError
        );
        // PTR: the held name, else the automatic name, else NXDOMAIN.
        let ptr = |r: &Message| match &r.answers[0].data {
            RData::PTR(PTR(n)) => n.to_string(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            ptr(&ask(&mut s, "7.0.250.10.in-addr.arpa.", RecordType::PTR)),
            "web.lab."
        );
        assert_eq!(
            ptr(&ask(&mut s, "5.5.250.10.in-addr.arpa.", RecordType::PTR)),
            "c250005005.lab."
        );
        let r = ask(&mut s, "9.9.250.10.in-addr.arpa.", RecordType::PTR);
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
        assert_eq!(s.stats().nxdomain, 5);
    }

    #[test]
    fn outside_the_zone_is_forwarded_or_refused() {
        let mut s = server(false);
        let r = ask(&mut s, "example.com.", RecordType::A);
        assert_eq!(r.metadata.response_code, ResponseCode::Refused);
        assert!(!r.metadata.recursion_available);
        // A reverse name outside the subnet is outside the zone too.
        let r = ask(&mut s, "1.1.168.192.in-addr.arpa.", RecordType::PTR);
        assert_eq!(r.metadata.response_code, ResponseCode::Refused);
        let mut f = server(true);
        let mut q = Message::query();
        q.add_query(Query::query(
            Name::from_ascii("example.com.").unwrap(),
            RecordType::A,
        ));
        assert_eq!(f.handle(&q.to_vec().unwrap(), &store()), Answer::Forward);
        assert_eq!(f.stats().forwarded, 1);
    }

    #[test]
    fn malformed_queries_get_formerr_or_are_dropped() {
        let mut s = server(false);
        let mut q = Message::query();
        q.add_query(Query::query(
            Name::from_ascii("web.lab.").unwrap(),
            RecordType::A,
        ));
        let good = q.to_vec().unwrap();
        // Header only and a cut question: FORMERR with the id.
        match s.handle(&good[..good.len() - 3], &store()) {
            Answer::Reply(b) => {
                let r = Message::from_vec(&b).unwrap();
                assert_eq!(
                    (r.metadata.id, r.metadata.response_code),
                    (q.metadata.id, ResponseCode::FormErr)
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.handle(&good[..5], &store()), Answer::Drop);
        // A response is never answered (no reflection loops).
        let mut resp = q.clone();
        resp.metadata.message_type = MessageType::Response;
        assert_eq!(s.handle(&resp.to_vec().unwrap(), &store()), Answer::Drop);
        // Two questions: FORMERR. Every prefix and corruption: no panic.
        let mut two = q.clone();
        two.add_query(Query::query(
            Name::from_ascii("db.lab.").unwrap(),
            RecordType::A,
        ));
        assert!(matches!(
            s.handle(&two.to_vec().unwrap(), &store()),
            Answer::Reply(_)
        ));
        for n in 0..good.len() {
            let _ = s.handle(&good[..n], &store());
            for v in [0u8, 0x3f, 0xc0, 0xff] {
                let mut c = good.clone();
                c[n] = v;
                let _ = s.handle(&c, &store());
            }
        }
        assert!(s.stats().errors >= 2);
    }
}
