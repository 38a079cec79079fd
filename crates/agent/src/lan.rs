//! Router and hybrid modes' devices: the LAN bridge, the uplink, and (hybrid) the veth pair
//! whose host end carries the host's virtual address (IPOP Fig. 3 and 4).
//!
//! Links are set up with iproute2's `ip`, which every Linux host has (see DECISIONS.md). The
//! bridge is created if missing and left in place when the agent stops, so the LAN keeps
//! working without it; the hybrid veth is removed with the namespace, as a TAP is.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::config::{Mode, Namespace};

/// The links a router- or hybrid-mode namespace set up; the veth goes when this is dropped.
pub struct Lan {
    /// Hybrid mode: the host end of the veth pair (deleting it deletes the pair).
    veth: Option<String>,
}

impl Drop for Lan {
    fn drop(&mut self) {
        if let Some(veth) = &self.veth {
            if let Err(e) = ip(&["link", "del", veth]) {
                tracing::warn!(device = %veth, error = %e, "cannot remove the veth");
            }
        }
    }
}

/// The TAP's name: the configured device, or in hybrid mode (where the device is the host's
/// veth) the device name plus `t`.
pub fn tap_name(ns: &Namespace) -> String {
    match ns.mode {
        Mode::Hybrid => format!("{}t", ns.device),
        Mode::Interface | Mode::Router => ns.device.clone(),
    }
}

/// Puts the TAP `tap` on the namespace's bridge (created if missing), enslaves the uplink,
/// and in hybrid mode creates the host's veth (with `device_mac`) with its peer on the bridge.
///
/// The TAP and the veth take the LAN's MTU, not the namespace's: a bridge drops a frame
/// larger than the port it leaves by, so a bridge port at 1420 would silently lose a 1500-byte
/// host's full-size frames. The switch fits what is larger than the tunnel (see
/// `hyphae_vswitch::mtu`).
pub fn attach(ns: &Namespace, tap: &str, device_mac: [u8; 6]) -> Result<Lan> {
    let Some(bridge) = ns.bridge.as_deref() else {
        bail!("namespace '{}': mode needs `bridge`", ns.name);
    };
    if !exists(bridge) {
        ip(&["link", "add", "name", bridge, "type", "bridge"])
            .with_context(|| format!("namespace '{}': cannot create bridge {bridge}", ns.name))?;
        tracing::info!(namespace = %ns.name, %bridge, "bridge created");
    } else if !Path::new(&format!("/sys/class/net/{bridge}/bridge")).exists() {
        bail!(
            "namespace '{}': {bridge} exists and is not a bridge; name another `bridge`",
            ns.name
        );
    }
    ip(&["link", "set", bridge, "up"])?;
    if let Some(uplink) = ns.uplink.as_deref() {
        if !exists(uplink) {
            bail!("namespace '{}': uplink {uplink} does not exist", ns.name);
        }
    }
    // The uplink's MTU, or the bridge's before the TAP joins (a bridge has its smallest
    // port's MTU, or 1500 with none).
    let lan_mtu = mtu_of(ns.uplink.as_deref().unwrap_or(bridge))?;
    if lan_mtu < ns.mtu {
        tracing::warn!(namespace = %ns.name, lan_mtu, mtu = ns.mtu,
            "the LAN's MTU is below the namespace MTU: set `mtu` to at most the LAN's");
    }
    let lan_mtu = lan_mtu.to_string();
    ip(&["link", "set", tap, "mtu", &lan_mtu, "master", bridge, "up"])
        .with_context(|| format!("namespace '{}': cannot put {tap} on {bridge}", ns.name))?;
    if let Some(uplink) = ns.uplink.as_deref() {
        ip(&["link", "set", uplink, "master", bridge, "up"])
            .with_context(|| format!("namespace '{}': cannot put {uplink} on {bridge}", ns.name))?;
    }
    let mut lan = Lan { veth: None };
    if ns.mode == Mode::Hybrid {
        let device = ns.device.as_str();
        let peer = format!("{device}p");
        if exists(device) {
            bail!(
                "namespace '{}': device {device} already exists; pick another `device`",
                ns.name
            );
        }
        let mac = format_mac(device_mac);
        ip(&[
            "link", "add", device, "address", &mac, "type", "veth", "peer", "name", &peer,
        ])
        .with_context(|| format!("namespace '{}': cannot create veth {device}", ns.name))?;
        lan.veth = Some(device.to_string());
        // The overlay carries IPv4: keep IPv6 chatter off the host's device.
        let _ = std::fs::write(
            format!("/proc/sys/net/ipv6/conf/{device}/disable_ipv6"),
            "1",
        );
        ip(&[
            "link", "set", &peer, "mtu", &lan_mtu, "master", bridge, "up",
        ])?;
        ip(&["link", "set", device, "mtu", &lan_mtu, "up"])?;
    }
    Ok(lan)
}

/// Gives the hybrid host's device its virtual address (replacing any other).
pub fn set_address(device: &str, address: Ipv4Addr, prefix: u8) -> Result<()> {
    ip(&["-4", "addr", "flush", "dev", device])?;
    ip(&[
        "addr",
        "add",
        &format!("{address}/{prefix}"),
        "brd",
        "+",
        "dev",
        device,
    ])
}

/// Routes `net` (another namespace's addresses) through `gateway`, a member of this
/// namespace on `device` (a link of the policy).
pub fn set_route(device: &str, net: Ipv4Net, gateway: Ipv4Addr) -> Result<()> {
    ip(&[
        "-4",
        "route",
        "replace",
        &net.to_string(),
        "via",
        &gateway.to_string(),
        "dev",
        device,
        "onlink",
    ])
}

/// Removes the route to `net` on `device`.
pub fn del_route(device: &str, net: Ipv4Net) -> Result<()> {
    ip(&["-4", "route", "del", &net.to_string(), "dev", device])
}

/// The MTU of `link`, from sysfs.
fn mtu_of(link: &str) -> Result<u16> {
    let path = format!("/sys/class/net/{link}/mtu");
    std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {path}"))?
        .trim()
        .parse()
        .with_context(|| format!("{path} does not hold an MTU"))
}

fn exists(link: &str) -> bool {
    Path::new(&format!("/sys/class/net/{link}")).exists()
}

fn format_mac(m: [u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

/// Runs `ip ARGS`; an error carries what `ip` printed.
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("cannot run `ip` (install iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
