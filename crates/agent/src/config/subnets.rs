//! A namespace's subnets in the config: `subnet`, and `subnets` for a multi-subnet
//! namespace (docs/MODES.md, "Several subnets").

use std::net::Ipv4Addr;

use anyhow::{bail, Result};
use ipnet::Ipv4Net;

use super::NamespaceSection;

/// A namespace's `subnet` and `subnets`: this member's subnet, and every subnet of a
/// multi-subnet namespace (empty for one). Without `subnet`, this member's is the one of
/// `subnets` holding its static address, else the first.
pub(super) fn parse_subnets(s: &NamespaceSection) -> Result<(Option<Ipv4Net>, Vec<Ipv4Net>)> {
    let subnet = s.subnet.as_deref().map(parse_subnet).transpose()?;
    let Some(list) = &s.subnets else {
        return Ok((subnet, Vec::new()));
    };
    let subnets = list
        .iter()
        .map(|t| parse_subnet(t))
        .collect::<Result<Vec<_>>>()?;
    if subnets.is_empty() {
        bail!("subnets is empty: list the namespace's subnets, or use `subnet` for one");
    }
    hyphae_overlay::membership::check_subnets(&subnets)
        .map_err(|e| anyhow::anyhow!("subnets: {e}"))?;
    let own = match subnet {
        Some(net) if !subnets.contains(&net) => bail!(
            "subnet {net} is not one of `subnets` ({}): it names this member's own subnet",
            list.join(", ")
        ),
        Some(net) => net,
        None => {
            let fixed: Option<Ipv4Addr> = s.address.as_deref().and_then(|a| a.parse().ok());
            fixed
                .and_then(|a| subnets.iter().find(|n| n.contains(&a)))
                .copied()
                .unwrap_or(subnets[0])
        }
    };
    // One subnet listed is the one-subnet case.
    let subnets = if subnets.len() > 1 {
        subnets
    } else {
        Vec::new()
    };
    Ok((Some(own), subnets))
}

/// A namespace subnet: an IPv4 CIDR with no host bits, /30 or larger.
pub fn parse_subnet(text: &str) -> Result<Ipv4Net> {
    let subnet: Ipv4Net = text
        .parse()
        .map_err(|_| anyhow::anyhow!("subnet '{text}' is not an IPv4 CIDR like 10.201.0.0/16"))?;
    if subnet != subnet.trunc() {
        bail!(
            "subnet '{text}' has host bits set; did you mean {}?",
            subnet.trunc()
        );
    }
    if subnet.prefix_len() > 30 {
        bail!("subnet '{text}' is too small: use a prefix of /30 or shorter");
    }
    Ok(subnet)
}

/// Whether `address` can be a member's address in `subnet`.
pub fn check_in_subnet(address: Ipv4Addr, subnet: Ipv4Net) -> Result<()> {
    hyphae_overlay::membership::check_address(address, subnet).map_err(anyhow::Error::msg)
}
