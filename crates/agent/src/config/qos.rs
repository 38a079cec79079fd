//! The rate settings of a config (docs/QOS.md): a namespace's egress cap (`rate`, `burst`)
//! and share of the uplink (`weight`), and the uplink's rate (`[agent] uplink_rate`).

use std::net::{IpAddr, SocketAddr};

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

/// One `[[agent.uplinks]]`: an address of this host (a bare IP takes the listen port) and
/// its rate.
pub(super) fn uplink_link(address: &str, rate: &str, port: u16) -> Result<(SocketAddr, u64)> {
    let addr = match address.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => match address.parse::<IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, port),
            Err(_) => bail!("'{address}' is not an address (an IP, or IP:port)"),
        },
    };
    if addr.ip().is_unspecified() || addr.ip().is_multicast() {
        bail!("'{address}': an uplink is one address of this host");
    }
    let bits = parse_rate(rate).map_err(|e| anyhow::anyhow!("{address}: {e}"))?;
    Ok((addr, bits))
}

/// The uplinks as a whole: two to eight distinct ones (or none), and an underlay that can
/// send down each: one socket bound to every address (`listen` on 0.0.0.0 or [::]), so the
/// kernel's routes pick the link for each member address.
pub(super) fn bond(
    links: Vec<(SocketAddr, u64)>,
    listen: SocketAddr,
    underlay: super::UnderlayMode,
) -> Result<Vec<(SocketAddr, u64)>> {
    if links.is_empty() {
        return Ok(links);
    }
    hyphae_overlay::node::check_uplinks(&links).map_err(|e| anyhow::anyhow!("{e}"))?;
    if !listen.ip().is_unspecified() {
        bail!("uplinks need [agent] listen on every address (0.0.0.0:PORT or [::]:PORT), not {listen}");
    }
    if underlay != super::UnderlayMode::Socket {
        bail!("uplinks need underlay = \"socket\"");
    }
    if let Some((a, _)) = links.iter().find(|(a, _)| a.port() != listen.port()) {
        bail!(
            "uplink {a}: members reach this agent on its listen port {}",
            listen.port()
        );
    }
    Ok(links)
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
