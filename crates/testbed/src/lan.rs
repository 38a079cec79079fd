//! LANs in the testbed: a LAN's switch (a namespace with a bridge), plain hosts plugged
//! into a bridge (a LAN's, or a router host's own), and a host's port moved between two LANs
//! as a live migration moves a VM.

use std::fs;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{run, Host, Testbed};

impl Testbed {
    /// Adds a LAN: a namespace holding a bridge `br0` that hosts plug into with
    /// [`Testbed::plug`] (a site's switch, as the underlay has its own). Returns its name.
    /// A switch is no IPv6 host: its bridge and ports form no addresses from a router's
    /// advertisement (a bridge takes its lowest port's MAC, so two LANs' bridges would
    /// form the same address when a port moves between them).
    pub fn add_lan(&mut self, name: &str) -> Result<String> {
        let ns = format!("{}-{name}", self.prefix);
        run("ip", &["netns", "add", &ns])?;
        self.namespaces.push(ns.clone());
        for scope in ["all", "default"] {
            let key = format!("net.ipv6.conf.{scope}.disable_ipv6=1");
            self.ns(&ns, "sysctl", &["-qw", &key])?;
        }
        self.ns(&ns, "ip", &["link", "add", "br0", "type", "bridge"])?;
        self.ns(&ns, "ip", &["link", "set", "br0", "up"])?;
        Ok(ns)
    }

    /// Plugs namespace `host_ns` into `lan` with a veth named `ifname` there (up, no
    /// address, MTU `mtu`).
    pub fn plug(&mut self, lan: &str, host_ns: &str, ifname: &str, mtu: u16) -> Result<()> {
        self.plug_into(lan, "br0", host_ns, ifname, mtu).map(|_| ())
    }

    /// Plugs namespace `host_ns` into `bridge` of namespace `lan` (a LAN's switch, or a
    /// router host whose agent's bridge the LAN hosts sit on) with a veth named `ifname`
    /// there; returns the port's name on the bridge side.
    pub fn plug_into(
        &mut self,
        lan: &str,
        bridge: &str,
        host_ns: &str,
        ifname: &str,
        mtu: u16,
    ) -> Result<String> {
        self.ports += 1;
        let port = format!("l{}", self.ports);
        self.ns(
            lan,
            "ip",
            &[
                "link", "add", &port, "type", "veth", "peer", "name", ifname, "netns", host_ns,
            ],
        )?;
        self.ns(lan, "ip", &["link", "set", &port, "master", bridge, "up"])?;
        let mtu = mtu.to_string();
        self.ns(host_ns, "ip", &["link", "set", ifname, "mtu", &mtu, "up"])?;
        Ok(port)
    }

    /// Adds a plain LAN host (no hyphae, no underlay): `eth0` on `lan` with `address`
    /// (`a.b.c.d/len`, or empty for none: a DHCP client's) and MTU `mtu`. Its `underlay`
    /// field holds the LAN address (unspecified without one).
    pub fn add_lan_host(&mut self, lan: &str, name: &str, address: &str, mtu: u16) -> Result<Host> {
        self.add_lan_host_on(lan, "br0", name, address, mtu)
    }

    /// [`Testbed::add_lan_host`] on `bridge` of namespace `lan` (e.g. a router host's own
    /// LAN bridge, created there first).
    pub fn add_lan_host_on(
        &mut self,
        lan: &str,
        bridge: &str,
        name: &str,
        address: &str,
        mtu: u16,
    ) -> Result<Host> {
        let ns = format!("{}-{name}", self.prefix);
        run("ip", &["netns", "add", &ns])?;
        self.namespaces.push(ns.clone());
        self.plug_into(lan, bridge, &ns, "eth0", mtu)?;
        if !address.is_empty() {
            self.ns(
                &ns,
                "ip",
                &["addr", "add", address, "brd", "+", "dev", "eth0"],
            )?;
        }
        self.ns(&ns, "ip", &["link", "set", "lo", "up"])?;
        let dir = self.dir.join(name);
        fs::create_dir_all(&dir)?;
        let ip = address.split('/').next().unwrap_or_default();
        Ok(Host {
            ns,
            name: name.to_string(),
            underlay: if ip.is_empty() {
                Ipv4Addr::UNSPECIFIED
            } else {
                ip.parse().context("LAN host address")?
            },
            dir,
        })
    }

    /// The global IPv6 address `host`'s kernel formed on `eth0` from a router
    /// advertisement (SLAAC: "dynamic"), once it passed duplicate address detection; an
    /// error after `within`.
    pub fn slaac_address(&self, host: &Host, within: Duration) -> Result<Ipv6Addr> {
        let deadline = Instant::now() + within;
        loop {
            let out =
                self.ns_output(&host.ns, "ip", &["-6", "-o", "addr", "show", "dev", "eth0"])?;
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let formed = text.lines().find_map(|line| {
                let mut words = line.split_whitespace().skip_while(|w| *w != "inet6");
                let address: Ipv6Addr = words.nth(1)?.split('/').next()?.parse().ok()?;
                let done = !line.contains("tentative") && line.contains("dynamic");
                (done && line.contains("scope global")).then_some(address)
            });
            if let Some(a) = formed {
                return Ok(a);
            }
            if Instant::now() > deadline {
                bail!("{} formed no address within {within:?}: {text}", host.name);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The bridge end (in `lan`) of `host`'s `eth0` veth.
    pub fn bridge_port(&self, host: &Host, lan: &str) -> Result<String> {
        let out = self.ns_output(&host.ns, "ip", &["-o", "link", "show", "eth0"])?;
        let text = String::from_utf8_lossy(&out.stdout);
        let peer = text
            .split("@if")
            .nth(1)
            .and_then(|rest| rest.split(':').next())
            .with_context(|| format!("no veth peer in {text}"))?
            .to_string();
        let out = self.ns_output(lan, "ip", &["-o", "link"])?;
        let links = String::from_utf8_lossy(&out.stdout);
        links
            .lines()
            .find(|l| l.starts_with(&format!("{peer}: ")))
            .and_then(|l| l.split(": ").nth(1))
            .and_then(|name| name.split('@').next())
            .map(str::to_string)
            .with_context(|| format!("no link {peer} in {links}"))
    }

    /// Moves the bridge end `port` from `from`'s bridge `br0` to `to`'s (the host keeps its
    /// IP and MAC: a live migration between two LANs).
    pub fn move_port(&self, port: &str, from: &str, to: &str) -> Result<()> {
        self.ns(from, "ip", &["link", "set", port, "netns", to])?;
        self.ns(to, "ip", &["link", "set", port, "master", "br0", "up"])?;
        Ok(())
    }

    /// The MAC `host`'s ARP cache holds for `address` on `eth0`, if any.
    pub fn neighbour(&self, host: &Host, address: Ipv4Addr) -> Result<Option<String>> {
        let address = address.to_string();
        let out = self.ns_output(&host.ns, "ip", &["neigh", "show", &address, "dev", "eth0"])?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        Ok(text
            .split_whitespace()
            .skip_while(|w| *w != "lladdr")
            .nth(1)
            .map(str::to_string))
    }
}
