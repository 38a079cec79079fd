//! The rate settings of a config (docs/QOS.md): a namespace's egress cap (`rate`, `burst`)
//! and share of the uplink (`weight`), and the uplink's rate (`[agent] uplink_rate`).

use anyhow::{bail, Result};
use hyphae_vswitch::qos::parse_rate;

/// Most a namespace's weight may be.
pub(super) const MAX_WEIGHT: u64 = 1000;

/// A namespace's cap: bits a second and a burst in bytes (default 10 ms at the rate).
pub(super) fn egress(rate: &Option<String>, burst: Option<u64>) -> Result<Option<(u64, u64)>> {
    match (rate, burst) {
        (Some(r), burst) => {
            let bits = parse_rate(r).map_err(|e| anyhow::anyhow!(e))?;
            Ok(Some((bits, burst.unwrap_or(bits / 8 / 100))))
        }
        (None, Some(_)) => bail!("burst needs a rate"),
        (None, None) => Ok(None),
    }
}

/// The uplink's rate, bits a second.
pub(super) fn uplink(rate: &Option<String>) -> Result<Option<u64>> {
    rate.as_deref()
        .map(|r| parse_rate(r).map_err(|e| anyhow::anyhow!("uplink_{e}")))
        .transpose()
}

/// A namespace's weight, 1 to [`MAX_WEIGHT`].
pub(super) fn weight(weight: Option<u64>) -> Result<Option<u64>> {
    match weight {
        Some(w) if !(1..=MAX_WEIGHT).contains(&w) => {
            bail!("weight {w}: 1 to {MAX_WEIGHT}")
        }
        w => Ok(w),
    }
}
