//! Addresses and secrets named in the config: DNS resolvers (the host's resolv.conf),
//! bootstrap contacts, `host:port` endpoints, the namespace secret file.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;

use anyhow::{bail, Context, Result};
use hyphae_overlay::swarm::Multiaddr;

use super::DEFAULT_PORT;

/// Where the host's resolvers are read from when a namespace has no `resolvers`.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";

/// The `nameserver` lines of a resolv.conf, at most [`MAX_HOST_RESOLVERS`], port 53 (the
/// format of resolv.conf(5); addresses that do not parse, such as link-local IPv6 with a
/// `%zone`, are skipped).
pub fn host_resolvers(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == "nameserver").then(|| words.next())?
        })
        .filter_map(|a| a.parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .take(MAX_HOST_RESOLVERS)
        .collect()
}

/// The C library reads at most this many nameservers (MAXNS in resolv.h): so do we.
pub const MAX_HOST_RESOLVERS: usize = 3;

/// A DNS resolver: an IP address, with port 53 unless one is given (`192.0.2.53`,
/// `192.0.2.53:5353`, `2001:db8::53`, `[2001:db8::53]:53`).
pub fn parse_resolver(text: &str) -> Result<SocketAddr> {
    if let Ok(ip) = text.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, 53));
    }
    text.parse::<SocketAddr>().map_err(|_| {
        anyhow::anyhow!("resolver '{text}' is not an IP address (with an optional :port)")
    })
}

/// A bootstrap address: `host:port` / `host` (the member's listen port, TCP) or a libp2p
/// multiaddr such as `/ip4/10.200.0.1/tcp/7400/p2p/12D3...`.
pub fn parse_bootstrap(text: &str) -> Result<Multiaddr> {
    if text.starts_with('/') {
        return text
            .parse::<Multiaddr>()
            .map_err(|e| anyhow::anyhow!("bootstrap '{text}' is not a valid multiaddr ({e})"));
    }
    let addr = resolve(text).with_context(|| format!("bootstrap '{text}'"))?;
    Ok(hyphae_overlay::swarm::tcp_multiaddr(addr))
}

pub(super) fn read_secret(path: &Path) -> Result<Vec<u8>> {
    use std::os::unix::fs::PermissionsExt as _;
    let file = std::fs::File::open(path).with_context(|| {
        format!(
            "cannot read secret_file {} (create one with `(umask 077; hyphae secret > {})`)",
            path.display(),
            path.display()
        )
    })?;
    // Anyone who can read the secret can join the namespace: like ssh with its private
    // keys, refuse one that other users can read rather than use it.
    let mode = file.metadata()?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!(
            "secret_file {} is accessible by group or others (mode {mode:03o}); run `chmod 600 {}`",
            path.display(),
            path.display()
        );
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut &file, &mut bytes)
        .with_context(|| format!("cannot read secret_file {}", path.display()))?;
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    let secret = bytes[..end].to_vec();
    if secret.is_empty() {
        bail!(
            "secret_file {} is empty (create one with `(umask 077; hyphae secret > {})`)",
            path.display(),
            path.display()
        );
    }
    if secret.len() < hyphae_overlay::MIN_SECRET_LEN {
        bail!(
            "secret_file {} holds {} bytes; a namespace secret needs at least {} (use `hyphae secret`)",
            path.display(),
            secret.len(),
            hyphae_overlay::MIN_SECRET_LEN
        );
    }
    Ok(secret)
}

/// `host:port`, `host` (default port) or `[v6]:port`, resolved once.
pub(crate) fn resolve(endpoint: &str) -> Result<SocketAddr> {
    if let Ok(addr) = endpoint.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if let Ok(ip) = endpoint.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, DEFAULT_PORT));
    }
    let with_port = if endpoint.rsplit_once(':').is_some() {
        endpoint.to_string()
    } else {
        format!("{endpoint}:{DEFAULT_PORT}")
    };
    with_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| anyhow::anyhow!("'{endpoint}' is not an address like 10.200.0.2:7400"))
}
