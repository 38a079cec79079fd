//! Broadcast and multicast (IPOP 4.2): which destinations every member hears, and the token
//! bucket that limits them each way (`broadcast_rate`).

use std::net::Ipv4Addr;
use std::time::Instant;

use super::Switch;

/// A token bucket: `rate` tokens a second, at most `rate` held (full at first).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Bucket {
    pub(crate) tokens: f64,
    pub(crate) last: Option<Instant>,
}

impl Bucket {
    pub(crate) fn take(&mut self, rate: u32, now: Instant) -> bool {
        let rate = f64::from(rate);
        let elapsed = self.last.map_or(rate, |t| {
            now.saturating_duration_since(t).as_secs_f64() * rate
        });
        self.tokens = (self.tokens + elapsed).min(rate);
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

impl<P: Copy + Eq> Switch<P> {
    /// A destination every member hears: an IPv4 broadcast (limited or the subnet's) or a
    /// multicast group.
    pub(super) fn is_broadcast(&self, dst: Ipv4Addr) -> bool {
        dst.is_multicast() || dst.is_broadcast() || dst == self.subnet_broadcast()
    }

    pub(super) fn subnet_broadcast(&self) -> Ipv4Addr {
        self.config.subnet.broadcast()
    }
}
