//! MAC leases of a layer-2 namespace: each MAC on this member's side is a lease on its key,
//! claimed and renewed as a LAN host's address is (the same majority rule, the same trust),
//! so that a member's announcement of a MAC can be checked against the DHT; and reads of
//! who holds a MAC.

use std::time::{Duration, Instant};

use super::{holder_name, Event, Membership, Purpose, Request, Token, CLAIM_RETRY};
use crate::records::{Envelope, MemberInfo, Subject};
use crate::swarm::ClaimResult;
use crate::PeerId;

/// How soon a MAC another member holds is claimed again: a member gives a MAC up about a
/// second after its host went quiet there (the host moved here), and releases it then.
pub const MAC_RECLAIM: Duration = Duration::from_secs(1);

/// The lease on one MAC on this member's side.
#[derive(Debug, Default)]
pub(super) struct MacLease {
    owned: bool,
    claiming: Option<Token>,
    next: Option<Instant>,
}

/// What this member holds of its MACs (status).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MacLeases {
    /// MACs on this side whose lease this member holds.
    pub held: usize,
    /// MACs on this side not held (yet): being claimed, or held by another member.
    pub unheld: usize,
    /// Times a lease held was lost to another member (partitions merged).
    pub lost: u64,
}

impl Membership {
    /// Layer 2: the MACs on this member's side now. New ones are claimed; those gone are
    /// given back.
    pub fn set_macs(&mut self, now: Instant, macs: &[[u8; 6]]) {
        if self.left {
            return;
        }
        let gone: Vec<[u8; 6]> = self
            .macs
            .keys()
            .filter(|m| !macs.contains(m))
            .copied()
            .collect();
        for mac in gone {
            if self.macs.remove(&mac).is_some_and(|l| l.owned) {
                self.request(Request::Release {
                    key: self.keys.mac_key(mac),
                });
            }
        }
        for mac in macs {
            self.macs.entry(*mac).or_insert(MacLease {
                next: Some(now),
                ..MacLease::default()
            });
        }
    }

    /// What this member holds of its MACs.
    pub fn mac_leases(&self) -> MacLeases {
        let held = self.macs.values().filter(|l| l.owned).count();
        MacLeases {
            held,
            unheld: self.macs.len() - held,
            lost: self.mac_conflicts,
        }
    }

    /// The MACs whose lease this member holds (given back when it leaves).
    pub(super) fn held_macs(&self) -> impl Iterator<Item = [u8; 6]> + '_ {
        self.macs.iter().filter(|(_, l)| l.owned).map(|(m, _)| *m)
    }

    /// Renews the held MAC leases soon (a new peer may be a replica).
    pub(super) fn renew_macs_by(&mut self, soon: Instant) {
        for l in self.macs.values_mut().filter(|l| l.owned) {
            l.next = Some(l.next.map_or(soon, |t| t.min(soon)));
        }
    }

    /// The earliest MAC claim due.
    pub(super) fn macs_due(&self) -> Option<Instant> {
        self.macs
            .values()
            .filter(|l| l.claiming.is_none())
            .filter_map(|l| l.next)
            .min()
    }

    /// Claims (and renews) the MACs that are due.
    pub(super) fn run_macs(&mut self, now: Instant) {
        let due: Vec<[u8; 6]> = self
            .macs
            .iter()
            .filter(|(_, l)| l.claiming.is_none() && l.next.is_some_and(|t| now >= t))
            .map(|(m, _)| *m)
            .collect();
        for mac in due {
            let key = self.keys.mac_key(mac);
            let info = MemberInfo {
                endpoints: self.endpoints.clone(),
                name: None,
                subject: Some(Subject::Mac(mac)),
            };
            let renewal = self.macs.get(&mac).is_some_and(|l| l.owned);
            let token = self
                .seal_record(&key, now, &crate::records::encode(&info))
                .map(|envelope| {
                    let request = Request::Claim {
                        key,
                        envelope,
                        renewal,
                    };
                    self.start_op(request, Purpose::Mac(mac))
                });
            if let Some(l) = self.macs.get_mut(&mac) {
                l.next = None;
                match token {
                    Some(token) => l.claiming = Some(token),
                    None => l.next = Some(now + CLAIM_RETRY),
                }
            }
        }
    }

    /// A MAC claim was decided.
    pub(super) fn mac_claimed(
        &mut self,
        now: Instant,
        token: Token,
        mac: [u8; 6],
        result: &ClaimResult,
    ) {
        let renew_at = now + self.lease / 3;
        let Some(l) = self.macs.get_mut(&mac) else {
            // Gone while the claim was out (and its release maybe ahead of a renewal): a
            // lease won for it is given back, or it would keep the MAC from its next site.
            if matches!(result, ClaimResult::Won | ClaimResult::Kept(_)) {
                self.request(Request::Release {
                    key: self.keys.mac_key(mac),
                });
            }
            return;
        };
        // Gone and back while the claim was out: the claim out now decides.
        if l.claiming != Some(token) {
            return;
        }
        l.claiming = None;
        let was = l.owned;
        match result {
            ClaimResult::Won | ClaimResult::Kept(_) => {
                l.owned = true;
                l.next = Some(renew_at);
                if !was {
                    tracing::debug!(namespace = %self.name, mac = %mac_text(mac), "MAC claimed");
                }
            }
            ClaimResult::Lost(Some(holder)) => {
                // A host that moved here from the holder's side: it lets the MAC go within
                // a second or so. Or the same MAC on two sides (a loop, a spoof): the
                // holder keeps it, and members drop this member's frames from it.
                if was {
                    self.mac_conflicts += 1;
                    tracing::warn!(namespace = %self.name, mac = %mac_text(mac), holder = %holder_name(holder),
                        "a MAC this member held is another member's now (partitions merged)");
                } else {
                    tracing::debug!(namespace = %self.name, mac = %mac_text(mac), holder = %holder_name(holder),
                        "a MAC on this side is held by another member; claimed again shortly");
                }
                l.owned = false;
                l.next = Some(now + MAC_RECLAIM);
            }
            ClaimResult::Lost(None) => l.next = Some(now + CLAIM_RETRY),
        }
    }

    /// Reads who holds `mac`: answered as [`Event::MacHolder`].
    pub fn read_mac_holder(&mut self, mac: [u8; 6]) {
        let key = self.keys.mac_key(mac);
        self.start_op(Request::Get { key }, Purpose::MacHolder(mac));
    }

    pub(super) fn mac_holder_found(&mut self, now: Instant, mac: [u8; 6], envelopes: &[Envelope]) {
        let key = self.keys.mac_key(mac);
        let unix = self.clock.unix(now);
        // The replica with the longest lease left speaks, as for an address.
        let holder = envelopes
            .iter()
            .filter_map(|e| {
                let (owner, info) = e.read::<MemberInfo>(&self.keys, &key, unix).ok()?;
                (info.subject == Some(Subject::Mac(mac))).then_some(())?;
                Some((PeerId::from_bytes(owner).ok()?, e.expires))
            })
            .max_by_key(|(_, expires)| *expires)
            .map(|(holder, _)| holder);
        self.events.push_back(Event::MacHolder { mac, holder });
    }
}

/// `02:48:..` as status and logs write a MAC.
pub fn mac_text(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}
