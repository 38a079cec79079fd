//! Consent between namespaces (issue 28, item 4; the HP study's inter-domain policy): a
//! `[[link]]` of a namespace's policy names another namespace, the member of both that
//! carries traffic between them (its `gateway` address in this namespace), and the other
//! namespace's addresses reachable through it (`remote`):
//!
//! ```toml
//! # namespace "shop": its members may reach namespace "data" through gw (10.1.0.250 here)
//! [[link]]
//! namespace = "data"
//! gateway = "10.1.0.250"
//! remote = ["10.2.0.0/24"]
//! ```
//!
//! Traffic crosses only where both namespaces link to each other through the same member,
//! and each side's rules allow the flow (an address of the other namespace has no groups
//! or name here, so rules name it by address or CIDR). A link is consent, not a rule: the
//! gateway forwards only while both sides' links stand, the members of this side route
//! `remote` to the gateway, and the members of the other side take packets from this
//! side's addresses only from that gateway.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use super::{is_label, PolicyError};

/// Most links one policy has.
pub const MAX_LINKS: usize = 16;

/// Most prefixes one link names.
pub const MAX_REMOTE: usize = 16;

/// A link as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkFile {
    /// The other namespace, by name.
    pub namespace: String,
    /// The gateway's address in this namespace.
    pub gateway: String,
    /// Addresses of the other namespace reachable through the gateway (addresses or CIDRs).
    pub remote: Vec<String>,
}

/// A link, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The other namespace, by name.
    pub namespace: String,
    /// The gateway's address in this namespace.
    pub gateway: Ipv4Addr,
    /// Addresses of the other namespace reachable through it.
    pub remote: Vec<Ipv4Net>,
}

impl Link {
    /// Whether `address` is one of the other namespace's this link reaches.
    pub fn reaches(&self, address: Ipv4Addr) -> bool {
        self.remote.iter().any(|n| n.contains(&address))
    }
}

fn error(link: usize, message: impl std::fmt::Display) -> PolicyError {
    PolicyError(format!("policy link {}: {message}", link + 1))
}

/// Checks and compiles the links of a policy file.
pub(super) fn compile(links: &[LinkFile]) -> Result<Vec<Link>, PolicyError> {
    if links.len() > MAX_LINKS {
        return Err(PolicyError(format!(
            "policy: {} links, at most {MAX_LINKS}",
            links.len()
        )));
    }
    let mut out: Vec<Link> = Vec::with_capacity(links.len());
    for (i, link) in links.iter().enumerate() {
        if !is_label(&link.namespace) {
            return Err(error(
                i,
                format!("namespace '{}' is not a namespace name", link.namespace),
            ));
        }
        if out.iter().any(|l| l.namespace == link.namespace) {
            return Err(error(
                i,
                format!("namespace '{}' is linked twice", link.namespace),
            ));
        }
        let gateway: Ipv4Addr = link.gateway.parse().map_err(|_| {
            error(
                i,
                format!("gateway '{}' is not an IPv4 address", link.gateway),
            )
        })?;
        if link.remote.is_empty() || link.remote.len() > MAX_REMOTE {
            return Err(error(
                i,
                format!(
                    "`remote` names 1 to {MAX_REMOTE} addresses or CIDRs of the other namespace"
                ),
            ));
        }
        let remote = link
            .remote
            .iter()
            .map(|w| {
                w.parse::<Ipv4Net>()
                    .map(|n| n.trunc())
                    .or_else(|_| w.parse::<Ipv4Addr>().map(Ipv4Net::from))
                    .map_err(|_| error(i, format!("remote '{w}': an address or a CIDR")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(n) = remote.iter().find(|n| {
            let a = n.network();
            a.is_multicast() || a.is_broadcast() || a.is_loopback() || a.is_unspecified()
        }) {
            return Err(error(
                i,
                format!("remote {n} is not unicast addresses of a namespace"),
            ));
        }
        if let Some(n) = remote.iter().find(|n| n.contains(&gateway)) {
            return Err(error(
                i,
                format!(
                    "remote {n} holds the gateway {gateway}, which is an address of this namespace"
                ),
            ));
        }
        if let Some(n) = out.iter().flat_map(|l| &l.remote).find(|n| {
            remote
                .iter()
                .any(|r| r.contains(&n.network()) || n.contains(&r.network()))
        }) {
            return Err(error(
                i,
                format!("remote overlaps {n}, which another link reaches"),
            ));
        }
        out.push(Link {
            namespace: link.namespace.clone(),
            gateway,
            remote,
        });
    }
    Ok(out)
}
