//! The host names of other members' addresses, as `hyphae status` shows them beside each
//! tunnel: read from the DHT (the PTR each address record carries), at most once per
//! [`MEMBER_NAME_REFRESH`] per address (after [`MEMBER_NAME_RETRY`] while no name is known:
//! a member that has just joined may not have published its name yet; twice as long after
//! each read that found none, up to the refresh, since many members never name
//! themselves), and forgotten with the tunnel.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use super::{Membership, Purpose, Request};

/// How often the host name of a member's address is read again from the DHT. Names change
/// rarely; a minute keeps the reads to one per member per minute, however often status is
/// asked (a scraper asks many times a second).
pub const MEMBER_NAME_REFRESH: Duration = Duration::from_secs(60);

/// How soon an address whose name is not known (the read found no name, failed, or has not
/// answered yet) is read again: a member that joined a moment ago names itself within
/// seconds, and an operator watching status expects to see it then, not a minute later.
pub const MEMBER_NAME_RETRY: Duration = Duration::from_secs(5);

/// One member address's name, as last read, and when the read started.
#[derive(Debug, Clone)]
pub(super) struct MemberName {
    name: Option<String>,
    read_at: Instant,
    /// Reads in a row that found no name.
    unnamed_reads: u32,
}

impl MemberName {
    /// How long after its last read the name is read again: a minute once known;
    /// [`MEMBER_NAME_RETRY`] after the first read that found none, doubling with each
    /// further one up to a minute. A member with no name costs each reader one read a
    /// minute, however often status is asked, as a named one does: with a fixed retry, every
    /// agent whose status was scraped read every nameless member every 5 s, a load that grows
    /// with the square of the namespace (`hyphae-agent --test scale`).
    fn due_after(&self) -> Duration {
        if self.name.is_some() {
            return MEMBER_NAME_REFRESH;
        }
        let doublings = self.unnamed_reads.saturating_sub(1).min(8);
        (MEMBER_NAME_RETRY * 2u32.pow(doublings)).min(MEMBER_NAME_REFRESH)
    }
}

impl Membership {
    /// The tunnels have members at `addresses` (each member's first): starts DHT reads of
    /// the names of those not read within [`MEMBER_NAME_REFRESH`] ([`MEMBER_NAME_RETRY`]
    /// while no name is known), and forgets the names
    /// of addresses not among them, so the cache stays as small as the tunnels. The name
    /// known so far stays until the answer replaces it. Nothing is read once left.
    pub fn refresh_member_names(&mut self, now: Instant, addresses: &[Ipv4Addr]) {
        let current: std::collections::HashSet<&Ipv4Addr> = addresses.iter().collect();
        self.member_names.retain(|a, _| current.contains(a));
        if self.left {
            return;
        }
        for &address in addresses {
            let due = self
                .member_names
                .get(&address)
                .is_none_or(|m| now.saturating_duration_since(m.read_at) >= m.due_after());
            if !due {
                continue;
            }
            let (name, unnamed_reads) = self
                .member_names
                .remove(&address)
                .map_or((None, 0), |m| (m.name, m.unnamed_reads));
            self.member_names.insert(
                address,
                MemberName {
                    name,
                    read_at: now,
                    unnamed_reads,
                },
            );
            let key = self.keys.address_key(address);
            self.start_op(Request::GetNear { key }, Purpose::ReadHolder(address));
        }
    }

    /// The name of a member's address, as last read.
    pub fn member_name(&self, address: Ipv4Addr) -> Option<&str> {
        self.member_names.get(&address)?.name.as_deref()
    }

    /// A read of `address`'s holder ended: its name, if the address is a member's whose
    /// name is kept.
    pub(super) fn member_name_read(&mut self, address: Ipv4Addr, holder: &Option<Option<String>>) {
        if let Some(m) = self.member_names.get_mut(&address) {
            m.name = holder.clone().flatten();
            m.unnamed_reads = if m.name.is_some() {
                0
            } else {
                m.unnamed_reads.saturating_add(1)
            };
        }
    }
}
