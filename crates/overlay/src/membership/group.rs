//! The namespace's broadcast group (IPOP 4.2): every member announces itself under the
//! group key and reads the others, so a broadcast goes to each of them.

use std::time::{Duration, Instant};

use super::{Event, Membership, Purpose, Request, GROUP_HEARTBEAT, GROUP_REFRESH};
use crate::records::{Envelope, MemberInfo};

/// How soon the group is read after a start, or when a broadcast finds it empty.
const READ_SOON: Duration = Duration::from_secs(1);

/// When to announce and to read the group.
#[derive(Debug, Default)]
pub(super) struct Group {
    next_announce: Option<Instant>,
    next_read: Option<Instant>,
    reading: bool,
}

impl Group {
    pub(super) fn start(&mut self, now: Instant) {
        if self.next_announce.is_none() {
            self.next_announce = Some(now);
            self.next_read = Some(now + READ_SOON);
        }
    }

    pub(super) fn renew_soon(&mut self, soon: Instant) {
        if let Some(t) = self.next_announce {
            self.next_announce = Some(t.min(soon));
        }
    }

    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        let read = self.next_read.filter(|_| !self.reading);
        [self.next_announce, read].into_iter().flatten().min()
    }
}

impl Membership {
    /// Announces this member in the group, and reads the group, when due.
    pub(super) fn run_group(&mut self, now: Instant) {
        if self.group.next_announce.is_some_and(|t| now >= t) {
            let key = self.keys.group_key();
            self.group.next_announce = Some(now + GROUP_HEARTBEAT.min(self.lease / 3));
            if let Some(envelope) = self.seal_member(&key, now, None, None) {
                self.request(Request::Announce { key, envelope });
            }
        }
        if !self.group.reading && self.group.next_read.is_some_and(|t| now >= t) {
            self.group.next_read = None;
            self.group.reading = true;
            let key = self.keys.group_key();
            self.start_op(Request::Members { key }, Purpose::GroupRead);
        }
    }

    /// Reads the group again soon (a broadcast is waiting for members to send it to).
    pub fn refresh_group_soon(&mut self, now: Instant) {
        if !self.group.reading && !self.left {
            let soon = now + READ_SOON;
            self.group.next_read = Some(self.group.next_read.map_or(soon, |t| t.min(soon)));
        }
    }

    /// The group was read: the members other than this one, and where to reach them.
    pub(super) fn group_read(&mut self, now: Instant, envelopes: &[Envelope]) {
        self.group.reading = false;
        self.group.next_read = Some(now + GROUP_REFRESH);
        let key = self.keys.group_key();
        let me = self.identity.peer_id();
        let unix = self.clock.unix(now);
        let members = envelopes
            .iter()
            .filter_map(|e| {
                let (owner, info) = e.read::<MemberInfo>(&self.keys, &key, unix).ok()?;
                let member = crate::PeerId::from_bytes(owner).ok()?;
                Some((member, *info.endpoints.first()?))
            })
            .filter(|(m, _)| *m != me)
            .collect();
        self.events.push_back(Event::Group(members));
    }
}
