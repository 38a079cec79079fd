//! A namespace's policy in the data path (docs/POLICY.md): each end of a tunnel checks
//! every packet against its own [`Firewall`], the sender before sealing (denied traffic
//! costs no underlay) and the receiver before the switch (authoritative: it knows the
//! sender by the certificate its tunnel showed, not by what the sender says). Router and
//! hybrid LAN hosts go through the same checks at their router, under its certificate and
//! their own addresses.
//!
//! Each member's [`Tags`] under the policy are worked out once, from its certificate, and
//! kept until its tunnel announces again or the policy changes: the check itself compares
//! bits, prefixes and ports.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use hyphae_overlay::cert::{armor, unarmor, Certificate, Refusal, SignedPolicy, Trust};
use hyphae_overlay::{Node, PeerHandle};
use hyphae_vswitch::policy::flows::{Firewall, Verdict};
use hyphae_vswitch::policy::{proto, Decision, DefaultAction, Packet, Policy, Tags};

use crate::control::PolicyStatus;

/// Where a namespace's policy comes from when its authority signed it.
pub(crate) const SIGNED_SOURCE: &str = "the authority's policy";

/// How often flows that timed out are swept from the table (each is also dropped when a
/// packet finds it timed out).
const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// One namespace's firewall, and the tags of this member and of the members it has
/// tunnels with.
pub(crate) struct LanePolicy {
    firewall: Firewall,
    own: Tags,
    peers: HashMap<PeerHandle, Tags>,
    next_sweep: Option<Instant>,
    /// Where the policy comes from (its file, or the authority), for status and messages.
    source: Option<String>,
    /// Signed policies taken that did not compile.
    pub(crate) refused: u64,
    /// Packets dropped for the policy: by this member as sender, as receiver.
    pub(crate) denied_out: u64,
    pub(crate) denied_in: u64,
    /// As a gateway: packets from this namespace forwarded to a linked one, and packets
    /// for this namespace dropped because no member here holds their destination.
    pub(crate) crossed: u64,
    pub(crate) crossing_dropped: u64,
}

/// Every address `membership` holds, IPv4 then IPv6 (its own and its LAN hosts').
fn own_addresses(membership: &hyphae_overlay::membership::Membership) -> Vec<IpAddr> {
    let v4 = membership.addresses().into_iter().map(IpAddr::V4);
    v4.chain(membership.addresses6().into_iter().map(IpAddr::V6))
        .collect()
}

/// The source and destination of IP packet `ip` (IPv4 or IPv6), if its header is there.
pub(crate) fn ends(ip: &[u8]) -> Option<(IpAddr, IpAddr)> {
    match ip.first()? >> 4 {
        4 => {
            let a = <[u8; 8]>::try_from(ip.get(12..20)?).ok()?;
            let src = Ipv4Addr::new(a[0], a[1], a[2], a[3]);
            let dst = Ipv4Addr::new(a[4], a[5], a[6], a[7]);
            Some((src.into(), dst.into()))
        }
        6 => {
            let src = Ipv6Addr::from(<[u8; 16]>::try_from(ip.get(8..24)?).ok()?);
            let dst = Ipv6Addr::from(<[u8; 16]>::try_from(ip.get(24..40)?).ok()?);
            Some((src.into(), dst.into()))
        }
        _ => None,
    }
}

/// The tags `cert`'s holder has under `policy` (none without a certificate).
fn tags_of(policy: &Policy, cert: Option<&Certificate>) -> Tags {
    match cert {
        Some(c) => policy.tags(c.groups().iter().map(String::as_str), Some(c.name())),
        None => Tags::default(),
    }
}

impl LanePolicy {
    /// `policy` for a member whose own certificate is `own` (none without an authority),
    /// with a table of `flows` flows.
    pub(crate) fn new(
        policy: Policy,
        source: Option<String>,
        own: Option<&Certificate>,
        flows: usize,
    ) -> Self {
        Self {
            source,
            refused: 0,
            own: tags_of(&policy, own),
            firewall: Firewall::new(policy, flows),
            peers: HashMap::new(),
            next_sweep: None,
            denied_out: 0,
            denied_in: 0,
            crossed: 0,
            crossing_dropped: 0,
        }
    }

    /// The policy in force.
    pub(crate) fn current(&self) -> &Policy {
        self.firewall.policy()
    }

    /// What it did, for status.
    pub(crate) fn status(&self) -> PolicyStatus {
        let f = &self.firewall;
        let stats = f.stats();
        let flows = f.flows().stats();
        PolicyStatus {
            file: self.source.clone(),
            version: f.policy().version(),
            signed: self.source.as_deref() == Some(SIGNED_SOURCE),
            refused: self.refused,
            default: match f.policy().default_action() {
                DefaultAction::Allow => "allow".into(),
                DefaultAction::Deny => "deny".into(),
            },
            rule_hits: stats.rule_hits.clone(),
            default_hits: stats.default_hits,
            denied_out: self.denied_out,
            denied_in: self.denied_in,
            links: f
                .policy()
                .links()
                .iter()
                .map(|l| l.namespace.clone())
                .collect(),
            crossed: self.crossed,
            crossing_dropped: self.crossing_dropped,
            stray_icmp_errors: stats.stray_icmp_errors,
            flows: f.flows().len(),
            flows_max: f.flows().capacity(),
            flows_evicted: flows.evicted,
            flows_expired: flows.expired,
            flows_revoked: stats.flows_revoked,
        }
    }

    fn peer_tags(&mut self, node: &Node, peer: PeerHandle) -> Tags {
        if let Some(tags) = self.peers.get(&peer) {
            return *tags;
        }
        let tags = tags_of(self.firewall.policy(), node.peer_certificate(peer));
        // Kept once the member showed its certificate (before, it has no addresses either).
        if node.peer_certificate(peer).is_some() {
            self.peers.insert(peer, tags);
        }
        tags
    }

    /// What becomes of IP packet `ip` (IPv4 or IPv6) from the member of tunnel `peer`, on its way to
    /// this member (the namespace's subnets are `namespace`'s).
    pub(crate) fn inbound(
        &mut self,
        now: Instant,
        node: &Node,
        peer: PeerHandle,
        ip: &[u8],
        namespace: &hyphae_vswitch::Config,
    ) -> Verdict {
        self.check(now, node, peer, ip, namespace, true)
    }

    /// What becomes of IP packet `ip` (IPv4 or IPv6) from this member (or its LAN), on its way to the
    /// member of tunnel `peer` (the namespace's subnets are `namespace`'s).
    pub(crate) fn outbound(
        &mut self,
        now: Instant,
        node: &Node,
        peer: PeerHandle,
        ip: &[u8],
        namespace: &hyphae_vswitch::Config,
    ) -> Verdict {
        self.check(now, node, peer, ip, namespace, false)
    }

    /// What becomes of IPv4 packet `ip` between two hosts of this router's LAN (VEPA
    /// ports: the agent reflects it): both ends have this member's tags, and rules name
    /// them by address. A denial counts as the sender's.
    pub(crate) fn local(&mut self, now: Instant, ip: &[u8]) -> Verdict {
        if self.firewall.is_open() {
            return Verdict::Pass;
        }
        let verdict = self.firewall.check(now, ip, self.own, self.own);
        if verdict != Verdict::Pass {
            self.denied_out += 1;
        }
        self.sweep(now);
        verdict
    }

    /// `ip` between this member and the member of tunnel `peer`, from it (`inbound`) or
    /// to it. An end whose address is another namespace's (a linked one, through a
    /// gateway) has no tags here: rules name it by address.
    fn check(
        &mut self,
        now: Instant,
        node: &Node,
        peer: PeerHandle,
        ip: &[u8],
        namespace: &hyphae_vswitch::Config,
        inbound: bool,
    ) -> Verdict {
        if self.firewall.is_open() {
            return Verdict::Pass;
        }
        let mut theirs = self.peer_tags(node, peer);
        let mut own = self.own;
        if let Some((src, dst)) = ends(ip) {
            // An address of another namespace (a linked one, through a gateway); IPv6
            // crosses no link, and multicast is the namespace's.
            let foreign = |a: IpAddr| match a {
                IpAddr::V4(a) => {
                    !namespace.in_namespace(a) && !a.is_broadcast() && !a.is_multicast()
                }
                IpAddr::V6(_) => false,
            };
            let (their_end, own_end) = if inbound { (src, dst) } else { (dst, src) };
            if foreign(their_end) {
                theirs = Tags::default();
            }
            if foreign(own_end) {
                own = Tags::default();
            }
        }
        let (from, to) = if inbound {
            (theirs, own)
        } else {
            (own, theirs)
        };
        let verdict = self.firewall.check(now, ip, from, to);
        if verdict != Verdict::Pass {
            if inbound {
                self.denied_in += 1;
            } else {
                self.denied_out += 1;
            }
        }
        self.sweep(now);
        verdict
    }

    /// Whether a layer-2 frame carrying `ethertype` may pass between this member and the
    /// member of tunnel `peer`, from it (`inbound`) or to it. Frames are decided one by one
    /// by member and EtherType (docs/POLICY.md, "Layer 2"); a denial is counted as a
    /// packet's.
    pub(crate) fn frame(
        &mut self,
        node: &Node,
        peer: PeerHandle,
        ethertype: u16,
        inbound: bool,
    ) -> bool {
        if self.firewall.is_open() {
            return true;
        }
        let theirs = self.peer_tags(node, peer);
        let (from, to) = if inbound {
            (theirs, self.own)
        } else {
            (self.own, theirs)
        };
        let pass = self.firewall.check_frame(ethertype, from, to);
        if !pass {
            if inbound {
                self.denied_in += 1;
            } else {
                self.denied_out += 1;
            }
        }
        pass
    }

    fn sweep(&mut self, now: Instant) {
        match self.next_sweep {
            Some(t) if now < t => {}
            _ => {
                self.firewall.expire(now);
                self.next_sweep = Some(now + SWEEP_INTERVAL);
            }
        }
    }

    /// The member of tunnel `peer` announced again (its certificate may have changed), or
    /// its tunnel is gone: its tags are worked out afresh.
    pub(crate) fn forget(&mut self, peer: PeerHandle) {
        self.peers.remove(&peer);
    }

    /// Puts a new policy in place: this member's tags and every member's are worked out
    /// under it, and the flows it no longer allows end (`members` gives, for an address,
    /// the tunnel it is reached through; addresses of this member's own have its tags).
    pub(crate) fn replace(
        &mut self,
        policy: Policy,
        own: Option<&Certificate>,
        own_addresses: &[IpAddr],
        node: &Node,
        members: impl Fn(IpAddr) -> Option<PeerHandle>,
    ) {
        self.own = tags_of(&policy, own);
        self.peers.clear();
        let own_tags = self.own;
        let tags = |a: IpAddr| {
            if own_addresses.contains(&a) {
                return own_tags;
            }
            members(a)
                .map(|h| tags_of(&policy, node.peer_certificate(h)))
                .unwrap_or_default()
        };
        self.firewall.replace(policy.clone(), tags);
    }
}

impl super::Control {
    /// Puts `policy` in force in namespace `i`'s data path at once: the flows it no
    /// longer allows end. Returns what happened, in a line for the operator.
    fn put_policy(&mut self, i: usize, policy: Policy, source: String) -> String {
        let n = &self.namespaces[i];
        let name = n.name.clone();
        let own = n.certificate.clone();
        let own_addresses = own_addresses(&n.membership);
        let version = policy.version();
        let ended = {
            let mut dp = super::workers::lock(&self.dp);
            let dp = &mut *dp;
            let Some(lane) = dp.lanes.get_mut(i) else {
                return format!("{name}: no data path");
            };
            if *lane.policy.firewall.policy() == policy {
                lane.policy.source = Some(source);
                return format!("{name}: policy unchanged");
            }
            let switch = &lane.switch;
            let before = lane.policy.firewall.stats().flows_revoked;
            lane.policy
                .replace(policy, own.as_ref(), &own_addresses, &dp.node, |a| {
                    switch.route_ip(a)
                });
            lane.policy.source = Some(source);
            lane.policy.firewall.stats().flows_revoked - before
        };
        self.apply_links(i);
        tracing::info!(namespace = %name, version, ended, "policy replaced");
        format!("{name}: policy v{version} in force ({ended} flows ended)")
    }

    /// SIGHUP or `hyphae cert install`: each namespace with a policy file reads it again.
    /// A new policy that checks out takes the old one's place at once (the flows it no
    /// longer allows end); one with a mistake leaves the old one in force. With an
    /// authority the file is signed, and a newer version is published to the namespace
    /// as `hyphae policy publish` does. Returns one line per namespace with a policy file.
    pub(crate) fn reload_policies(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        for i in 0..self.namespaces.len() {
            let n = &self.namespaces[i];
            let Some(path) = n.policy_path.clone().filter(|_| n.active()) else {
                continue;
            };
            let name = n.name.clone();
            if n.certificate.is_some() {
                let held = self.held_policy_version(i);
                let line = std::fs::read_to_string(&path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))
                    .and_then(|text| {
                        // The file's version no newer than the one in force: nothing to do.
                        let version = unarmor(&text)
                            .ok()
                            .and_then(|b| SignedPolicy::decode(&b).ok())
                            .map(|p| p.version());
                        match version {
                            Some(v) if v <= held => Ok(format!(
                                "{name}: policy v{held} in force (the file is v{v})"
                            )),
                            _ => self
                                .publish_policy(&name, &text)
                                .map(|v| format!("{name}: policy v{v} in force and published")),
                        }
                    });
                lines.push(line.unwrap_or_else(|e| format!("{name}: policy not reloaded: {e}")));
                continue;
            }
            match crate::config::read_policy(&path, None, self.is_layer2(i)) {
                Ok(policy) => lines.push(self.put_policy(i, policy, path.display().to_string())),
                Err(e) => {
                    tracing::warn!(namespace = %name, "policy not reloaded: {e:#}");
                    lines.push(format!("{name}: policy not reloaded: {e:#}"));
                }
            }
        }
        lines
    }

    /// `hyphae policy publish`: the signed policy in `text` (armored) for namespace
    /// `name`, if its authority signed it and it is newer than the one held (never an
    /// older one: no rollback), is put in force here and passed to every member. Returns
    /// its version.
    pub(crate) fn publish_policy(&mut self, name: &str, text: &str) -> Result<u64, String> {
        let i = self
            .active(name)
            .ok_or_else(|| format!("not a member of '{name}'"))?;
        if self.namespaces[i].certificate.is_none() {
            return Err(format!("namespace '{name}' has no authority: its policy is the config's `policy` file (edit it, then `systemctl reload hyphae` or SIGHUP)"));
        }
        if !crate::config::is_signed_policy(text) {
            return Err("not a signed policy (`hyphae policy sign` writes one)".into());
        }
        let bytes = unarmor(text).map_err(|_| "not a signed policy".to_string())?;
        let signed = SignedPolicy::decode(&bytes).map_err(|e| format!("refused: {e}"))?;
        // Checked before anyone else is given it: a policy this agent cannot read would
        // be passed on but never in force.
        let policy = crate::config::compile_policy(
            signed.text(),
            true,
            Some(self.is_layer2(i)),
            "signed policy",
        )
        .map_err(|e| format!("refused: {e:#}"))?;
        let tag = self.namespaces[i].tag;
        let version = self
            .overlay
            .update_policy(&tag, &bytes)
            .map_err(|e| match e {
                Refusal::Outdated => format!(
                    "version {} is not newer than the policy this member holds (version {}): a policy never rolls back; sign the change as a higher version",
                    signed.version(),
                    self.held_policy_version(i)
                ),
                e => format!("refused: {e}"),
            })?;
        self.put_policy(i, policy, SIGNED_SOURCE.into());
        self.keep_policy(i, &bytes);
        tracing::info!(namespace = %name, version, "policy published");
        Ok(version)
    }

    /// Whether namespace `i` is a layer-2 one (its policy decides frames).
    fn is_layer2(&self, i: usize) -> bool {
        super::workers::lock(&self.dp)
            .lanes
            .get(i)
            .is_some_and(|l| l.l2.is_some())
    }

    /// The version of the signed policy the overlay holds for namespace `i` (0: none).
    fn held_policy_version(&self, i: usize) -> u64 {
        self.overlay.policy_version(&self.namespaces[i].tag)
    }

    /// A member passed on a signed policy the overlay has taken (newer, the authority's).
    pub(crate) fn policy_from_member(&mut self, tag: [u8; hyphae_overlay::TAG_LEN], bytes: &[u8]) {
        let Some(i) = self
            .namespaces
            .iter()
            .position(|n| n.tag == tag && n.active())
        else {
            return;
        };
        let name = self.namespaces[i].name.clone();
        let layer2 = Some(self.is_layer2(i));
        let compiled = SignedPolicy::decode(bytes)
            .map_err(anyhow::Error::from)
            .and_then(|s| crate::config::compile_policy(s.text(), true, layer2, "signed policy"));
        match compiled {
            Ok(policy) => {
                let line = self.put_policy(i, policy, SIGNED_SOURCE.into());
                tracing::info!(namespace = %name, "policy from a member: {line}");
                self.keep_policy(i, bytes);
            }
            Err(e) => {
                if let Some(lane) = super::workers::lock(&self.dp).lanes.get_mut(i) {
                    lane.policy.refused += 1;
                }
                tracing::warn!(namespace = %name, "a signed policy from a member does not compile here, the one before stays in force: {e:#}");
            }
        }
    }

    /// Keeps signed policy `bytes` of namespace `i` in the state directory, so a restart
    /// starts from it.
    fn keep_policy(&self, i: usize, bytes: &[u8]) {
        let path = crate::setup::policy_file(&self.state_dir, &self.namespaces[i].name);
        let text = armor(crate::config::SIGNED_POLICY, bytes);
        if let Err(e) = std::fs::write(&path, text) {
            tracing::warn!(path = %path.display(), error = %e, "cannot keep the signed policy");
        }
    }
}

/// The policy in force for a namespace at start: the newest signed one `trust` holds
/// (from the config's file, or kept from before a restart) if any, else `configured`.
/// Returns it and where it comes from.
pub(crate) fn at_start(
    name: &str,
    trust: Option<&Trust>,
    (configured, layer2): (&Policy, bool),
    path: Option<&std::path::Path>,
) -> (Policy, Option<String>) {
    let from_file = || (configured.clone(), path.map(|p| p.display().to_string()));
    let Some(bytes) = trust.and_then(Trust::policy) else {
        return from_file();
    };
    match SignedPolicy::decode(bytes)
        .map_err(anyhow::Error::from)
        .and_then(|s| crate::config::compile_policy(s.text(), true, Some(layer2), "signed policy"))
    {
        Ok(policy) => (policy, Some(SIGNED_SOURCE.into())),
        Err(e) => {
            tracing::warn!(namespace = %name, "the signed policy kept does not compile: {e:#}");
            from_file()
        }
    }
}

/// `tcp/5432`, `udp/53`, `icmp`: the protocol and destination port `hyphae policy check`
/// asks about.
fn parse_traffic(text: &str) -> Result<(u8, u16), String> {
    let (proto, port) = match text.split_once('/') {
        Some((p, port)) => (p, Some(port)),
        None => (text, None),
    };
    let number = match proto {
        "tcp" => proto::TCP,
        "udp" => proto::UDP,
        "icmp" => proto::ICMP,
        other => return Err(format!("'{other}': tcp/PORT, udp/PORT or icmp")),
    };
    match (number, port) {
        (proto::ICMP, None) => Ok((number, 0)),
        (proto::ICMP, Some(_)) => Err("icmp has no port".into()),
        (_, Some(p)) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .map(|p| (number, p))
            .ok_or_else(|| format!("port '{p}': 1-65535")),
        (_, None) => Err(format!("{proto} needs a port: {proto}/PORT")),
    }
}

impl super::Control {
    /// `hyphae policy check`: what namespace `namespace`'s policy here says of `traffic`
    /// (`tcp/5432`) from `from` to `to` (addresses, or members' certificate names), and
    /// why: the rule that allows it, or the default.
    pub(crate) fn check_policy(
        &self,
        namespace: &str,
        from: &str,
        to: &str,
        traffic: &str,
    ) -> Result<(bool, String), String> {
        let (proto, dport) = parse_traffic(traffic)?;
        let i = self
            .namespaces
            .iter()
            .position(|n| n.name == namespace && n.active())
            .ok_or_else(|| format!("no namespace '{namespace}' here"))?;
        let n = &self.namespaces[i];
        let own_addresses = own_addresses(&n.membership);
        let own_name = n
            .certificate
            .as_ref()
            .map(|c| c.name().to_string())
            .or_else(|| n.membership.hostname().map(str::to_string));
        let dp = super::workers::lock(&self.dp);
        let lane = dp.lanes.get(i).ok_or("no such lane")?;
        let policy = lane.policy.firewall.policy();
        // A name stands for its IPv6 address when the other end is an IPv6 address.
        let v6 = [from, to]
            .iter()
            .any(|w| w.parse::<IpAddr>().is_ok_and(|a| a.is_ipv6()));
        let family = if v6 { "IPv6" } else { "IPv4" };
        // An endpoint: its address, its tags, and how it was known.
        let endpoint = |word: &str| -> Result<(IpAddr, Tags, String), String> {
            let address = match word.parse::<IpAddr>() {
                Ok(a) => a,
                Err(_) if own_name.as_deref() == Some(word) => own_addresses
                    .iter()
                    .find(|a| a.is_ipv6() == v6)
                    .copied()
                    .ok_or_else(|| {
                        format!("'{word}' is this member, which holds no {family} address yet")
                    })?,
                Err(_) => dp
                    .node
                    .peers()
                    .filter(|p| p.ns.0 == i)
                    .find(|p| {
                        dp.node
                            .peer_certificate(p.handle)
                            .is_some_and(|c| c.name() == word)
                    })
                    .and_then(|p| match v6 {
                        true => p.addresses6.first().copied().map(IpAddr::V6),
                        false => p.addresses.first().copied().map(IpAddr::V4),
                    })
                    .ok_or_else(|| {
                        format!(
                            "no member named '{word}' with an {family} address has a tunnel with this one (name an address)"
                        )
                    })?,
            };
            if own_addresses.contains(&address) {
                let who = own_name.clone().unwrap_or_else(|| "this member".into());
                return Ok((
                    address,
                    lane.policy.own,
                    format!("{address} ({who}, this member)"),
                ));
            }
            match lane.switch.route_ip(address) {
                Some(h) => {
                    let cert = dp.node.peer_certificate(h);
                    let who = cert.map_or_else(
                        || "a member".to_string(),
                        |c| format!("{}, groups [{}]", c.name(), c.groups().join(", ")),
                    );
                    Ok((address, tags_of(policy, cert), format!("{address} ({who})")))
                }
                None => Ok((
                    address,
                    Tags::default(),
                    format!("{address} (no member this one knows)"),
                )),
            }
        };
        let (src, from_tags, from_text) = endpoint(from)?;
        let (dst, to_tags, to_text) = endpoint(to)?;
        if src.is_ipv6() != dst.is_ipv6() {
            return Err(format!(
                "{src} and {dst} are of two families: a packet has one"
            ));
        }
        let packet = Packet {
            src,
            dst,
            proto,
            dport,
        };
        let file = lane
            .policy
            .source
            .clone()
            .unwrap_or_else(|| "no policy file".into());
        let what = format!("{traffic} from {from_text} to {to_text}");
        let version = policy.version();
        Ok(match policy.decide(from_tags, to_tags, &packet) {
            Decision::Rule(r) => (
                true,
                format!("allowed: {what}, by rule {} of {file} (version {version})", r + 1),
            ),
            Decision::DefaultAllow => (
                true,
                format!("allowed: {what}, by the default (no rule matches; {file}, version {version})"),
            ),
            Decision::DefaultDeny => (
                false,
                format!("denied: {what}: no rule of {file} (version {version}) allows it, and the default is deny"),
            ),
        })
    }
}
