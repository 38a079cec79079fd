//! A namespace's policy: which members may open which flows to which, decided per flow
//! and remembered ([`flows`]), so a flow allowed one way lets its replies through.
//!
//! The format ([`PolicyFile`], TOML or JSON through serde) is a namespace default and a
//! list of rules, each allowing traffic from a set of members to a set, by protocol and
//! ports:
//!
//! ```toml
//! default = "deny"                 # "allow": today's behaviour, every member reaches every port
//! groups = ["web", "db", "ops"]    # the groups rules may name (a typo is an error, not a silent miss)
//!
//! [[rule]]
//! from = ["group:web"]
//! to = ["group:db"]
//! proto = "tcp"
//! ports = ["5432"]
//!
//! [[rule]]
//! from = ["group:ops", "10.0.0.0/24"]
//! to = ["any"]
//! proto = "any"
//! ```
//!
//! A set names `any`, `group:NAME` (a group the member's certificate carries), `name:NAME`
//! (the certificate's name) and addresses or CIDRs, IPv4 or IPv6 (the packet's own
//! address: a router's LAN host is told apart from its router by its address; a CIDR of
//! one family never matches the other's packets). `proto = "icmp"` is ICMP for IPv4 and
//! ICMPv6 for IPv6. Groups and names need a
//! namespace with an authority: without one a member says what it is and nobody checks,
//! so such a policy may name addresses only ([`Policy::compile`] refuses the rest).
//!
//! A policy may also link the namespace to another through a gateway member of both
//! (`[[link]]`, [`links`]): consent for traffic between them, which each side's rules then
//! decide.
//!
//! [`Policy::compile`] turns a file into the matcher: each group and name the file mentions
//! becomes a bit, a member's certificate becomes a [`Tags`] mask once (not per packet), and
//! a decision is a walk over the rules comparing masks, prefixes and port ranges, first
//! match wins. Nothing here allocates per packet.

pub mod flows;
pub mod links;
pub mod reject;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// Most distinct groups one policy names (each is a bit of [`Tags`]).
pub const MAX_GROUPS: usize = 64;

/// Most distinct member names one policy names.
pub const MAX_NAMES: usize = 64;

/// Most rules in one policy.
pub const MAX_RULES: usize = 1024;

/// IP protocol numbers the rules name.
pub mod proto {
    /// ICMP.
    pub const ICMP: u8 = 1;
    /// TCP.
    pub const TCP: u8 = 6;
    /// UDP.
    pub const UDP: u8 = 17;
    /// ICMPv6 (what `proto = "icmp"` means for IPv6).
    pub const ICMPV6: u8 = 58;
}

/// What the namespace does with traffic no rule allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DefaultAction {
    /// Every member reaches every port (a namespace without a policy).
    #[default]
    Allow,
    /// Only what a rule allows.
    Deny,
}

/// A policy as written.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    /// The version: a policy replaces another only if newer (a signed one; the config's
    /// is taken as it is).
    #[serde(default)]
    pub version: u64,
    /// Traffic no rule allows: dropped (`deny`) or passed (`allow`).
    #[serde(default)]
    pub default: DefaultAction,
    /// Answer denied TCP with a reset and denied UDP with ICMP port unreachable, rather
    /// than dropping in silence.
    #[serde(default)]
    pub reject: bool,
    /// The groups rules may name.
    #[serde(default)]
    pub groups: Vec<String>,
    /// The rules, first match wins.
    #[serde(default, rename = "rule")]
    pub rules: Vec<RuleFile>,
    /// Consent to traffic with other namespaces through a gateway ([`links`]).
    #[serde(default, rename = "link")]
    pub links: Vec<links::LinkFile>,
}

/// One rule as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleFile {
    /// Who may open the flow.
    pub from: Vec<String>,
    /// To whom.
    pub to: Vec<String>,
    /// `tcp`, `udp`, `icmp` or `any`.
    #[serde(default = "any")]
    pub proto: String,
    /// Destination ports or ranges (`"5432"`, `"8000-8100"`); none: every port.
    #[serde(default)]
    pub ports: Vec<String>,
    /// A layer-2 namespace's rule: the EtherTypes of the frames it allows (`ipv4`, `arp`,
    /// `0x88b5`, ...; [`crate::layer2::parse_ethertype`]); none: every frame.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ethertypes: Vec<String>,
}

fn any() -> String {
    "any".into()
}

/// A policy refused, with the rule and the word at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError(pub(crate) String);

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PolicyError {}

fn error(rule: Option<usize>, message: impl fmt::Display) -> PolicyError {
    match rule {
        Some(i) => PolicyError(format!("policy rule {}: {message}", i + 1)),
        None => PolicyError(format!("policy: {message}")),
    }
}

/// A member as the policy sees it: the bits of the groups and the name its certificate
/// carries, among those the policy names ([`Policy::tags`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tags {
    /// One bit per group of the policy's `groups` list.
    pub groups: u64,
    /// One bit per name the policy mentions.
    pub names: u64,
}

/// A set of members and addresses, compiled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Set {
    any: bool,
    groups: u64,
    names: u64,
    nets: Vec<IpNet>,
}

impl Set {
    /// `address` of a member tagged `tags` (a CIDR matches only its own family: IpNet's
    /// `contains` compares across families as never).
    fn contains(&self, tags: Tags, address: IpAddr) -> bool {
        self.any
            || tags.groups & self.groups != 0
            || tags.names & self.names != 0
            || self.nets.iter().any(|n| n.contains(&address))
    }
}

/// A rule, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    from: Set,
    to: Set,
    /// `None`: any protocol.
    proto: Option<u8>,
    /// Inclusive destination port ranges; empty: any.
    ports: Vec<(u16, u16)>,
    /// The EtherTypes of the frames it allows (a layer-2 rule); empty: any.
    ethertypes: Vec<u16>,
}

impl Rule {
    /// Whether the rule speaks of IP flows (a protocol, ports or addresses), which a
    /// layer-2 namespace's frames do not have.
    fn names_ip(&self) -> bool {
        self.proto.is_some()
            || !self.ports.is_empty()
            || !self.from.nets.is_empty()
            || !self.to.nets.is_empty()
    }
}

/// Why traffic was allowed or denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Rule `n` (0-based) allows it.
    Rule(u16),
    /// No rule matched; the default allows it.
    DefaultAllow,
    /// No rule matched; the default denies it.
    DefaultDeny,
}

impl Decision {
    /// Whether the traffic passes.
    pub fn allows(self) -> bool {
        !matches!(self, Decision::DefaultDeny)
    }
}

/// One packet's identity as the rules see it: who sends it to whom, the protocol, and the
/// destination port (0 for ICMP and for protocols without ports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// IP protocol number (next header for IPv6).
    pub proto: u8,
    /// Destination port.
    pub dport: u16,
}

/// A compiled policy.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    version: u64,
    default: DefaultAction,
    reject: bool,
    groups: Vec<String>,
    names: Vec<String>,
    rules: Vec<Rule>,
    links: Vec<links::Link>,
}

impl Policy {
    /// No policy: every member reaches every port.
    pub fn allow_all() -> Self {
        Self::default()
    }

    /// Checks and compiles `file`. `certified`: the namespace has an authority, so groups
    /// and names mean something; without one only addresses may be named.
    pub fn compile(file: &PolicyFile, certified: bool) -> Result<Self, PolicyError> {
        if file.rules.len() > MAX_RULES {
            return Err(error(
                None,
                format!("{} rules, at most {MAX_RULES}", file.rules.len()),
            ));
        }
        if file.groups.len() > MAX_GROUPS {
            return Err(error(
                None,
                format!("{} groups, at most {MAX_GROUPS}", file.groups.len()),
            ));
        }
        for (i, g) in file.groups.iter().enumerate() {
            if !is_label(g) {
                return Err(error(None, format!("group '{g}' is not a group name (lowercase letters, digits, '-', '_', '.')")));
            }
            if file.groups[..i].contains(g) {
                return Err(error(None, format!("group '{g}' is listed twice")));
            }
        }
        if !certified && !file.groups.is_empty() {
            return Err(error(None, "`groups` needs a namespace with an authority (without one, members' groups are not checked): name addresses"));
        }
        let mut policy = Self {
            version: file.version,
            default: file.default,
            reject: file.reject,
            groups: file.groups.clone(),
            names: Vec::new(),
            rules: Vec::with_capacity(file.rules.len()),
            links: links::compile(&file.links)?,
        };
        for (i, rule) in file.rules.iter().enumerate() {
            let from = policy.set(i, "from", &rule.from, certified)?;
            let to = policy.set(i, "to", &rule.to, certified)?;
            let proto = match rule.proto.as_str() {
                "any" => None,
                "tcp" => Some(proto::TCP),
                "udp" => Some(proto::UDP),
                "icmp" => Some(proto::ICMP),
                other => {
                    return Err(error(
                        Some(i),
                        format!("proto '{other}': tcp, udp, icmp or any"),
                    ))
                }
            };
            if !rule.ports.is_empty() && !matches!(proto, Some(proto::TCP | proto::UDP)) {
                return Err(error(Some(i), "ports need proto = \"tcp\" or \"udp\""));
            }
            let ports = rule
                .ports
                .iter()
                .map(|p| {
                    parse_ports(p).ok_or_else(|| {
                        error(
                            Some(i),
                            format!("port '{p}': a port (1-65535) or a range like 8000-8100"),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let ethertypes = rule
                .ethertypes
                .iter()
                .map(|t| {
                    crate::layer2::parse_ethertype(t).ok_or_else(|| {
                        error(
                            Some(i),
                            format!("ethertype '{t}': {}", crate::layer2::ETHERTYPE_NAMES),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let rule = Rule {
                from,
                to,
                proto,
                ports,
                ethertypes,
            };
            if !rule.ethertypes.is_empty() && rule.names_ip() {
                return Err(error(Some(i), "`ethertypes` decides a layer-2 namespace's frames, which have no proto, ports or addresses: name members (any, group:, name:) and EtherTypes"));
            }
            policy.rules.push(rule);
        }
        Ok(policy)
    }

    fn set(
        &mut self,
        rule: usize,
        side: &str,
        words: &[String],
        certified: bool,
    ) -> Result<Set, PolicyError> {
        if words.is_empty() {
            return Err(error(
                Some(rule),
                format!("`{side}` is empty (write \"any\" for anyone)"),
            ));
        }
        let mut set = Set::default();
        for word in words {
            if word == "any" {
                set.any = true;
            } else if let Some(group) = word.strip_prefix("group:") {
                if !certified {
                    return Err(error(Some(rule), format!("'{word}' needs a namespace with an authority (without one, members' groups are not checked): name addresses")));
                }
                let Some(bit) = self.groups.iter().position(|g| g == group) else {
                    return Err(error(
                        Some(rule),
                        format!("unknown group '{group}' (not in `groups`)"),
                    ));
                };
                set.groups |= 1 << bit;
            } else if let Some(name) = word.strip_prefix("name:") {
                if !certified {
                    return Err(error(Some(rule), format!("'{word}' needs a namespace with an authority (without one, members' names are not checked): name addresses")));
                }
                if !is_label(name) {
                    return Err(error(Some(rule), format!("'{word}': not a member name")));
                }
                let bit = match self.names.iter().position(|n| n == name) {
                    Some(bit) => bit,
                    None if self.names.len() < MAX_NAMES => {
                        self.names.push(name.to_string());
                        self.names.len() - 1
                    }
                    None => {
                        return Err(error(
                            Some(rule),
                            format!("more than {MAX_NAMES} member names"),
                        ))
                    }
                };
                set.names |= 1 << bit;
            } else if let Ok(net) = word.parse::<IpNet>() {
                set.nets.push(net.trunc());
            } else if let Ok(address) = word.parse::<IpAddr>() {
                set.nets.push(IpNet::from(address));
            } else {
                return Err(error(
                    Some(rule),
                    format!(
                        "'{word}' in `{side}`: any, group:NAME, name:NAME, an address or a CIDR"
                    ),
                ));
            }
        }
        Ok(set)
    }

    /// Checks that the rules fit the namespace: a layer-2 one's decide frames by member
    /// and EtherType (no protocol, ports or addresses); an IP one's decide flows (no
    /// `ethertypes`).
    pub fn check_layer(&self, layer2: bool) -> Result<(), PolicyError> {
        for (i, rule) in self.rules.iter().enumerate() {
            if layer2 && rule.names_ip() {
                return Err(error(Some(i), "a layer-2 namespace's rules name members (any, group:, name:) and `ethertypes`, not proto, ports or addresses"));
            }
            if !layer2 && !rule.ethertypes.is_empty() {
                return Err(error(
                    Some(i),
                    "`ethertypes` needs a layer-2 namespace (layer = 2)",
                ));
            }
        }
        Ok(())
    }

    /// The policy's version.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// What happens to traffic no rule allows.
    pub fn default_action(&self) -> DefaultAction {
        self.default
    }

    /// Whether denied TCP and UDP are answered (reset, port unreachable).
    pub fn rejects(&self) -> bool {
        self.reject
    }

    /// Whether this policy lets everything through (no rule can deny).
    pub fn is_allow_all(&self) -> bool {
        self.default == DefaultAction::Allow && self.rules.is_empty()
    }

    /// How many rules.
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// Its links to other namespaces ([`links`]).
    pub fn links(&self) -> &[links::Link] {
        &self.links
    }

    /// The link to namespace `name`, if any.
    pub fn link_to(&self, name: &str) -> Option<&links::Link> {
        self.links.iter().find(|l| l.namespace == name)
    }

    /// A member with certificate `groups` and `name`, as this policy's bits (computed once
    /// per member and policy, not per packet).
    pub fn tags<'a>(&self, groups: impl IntoIterator<Item = &'a str>, name: Option<&str>) -> Tags {
        let mut tags = Tags::default();
        for g in groups {
            if let Some(bit) = self.groups.iter().position(|x| x == g) {
                tags.groups |= 1 << bit;
            }
        }
        if let Some(bit) = name.and_then(|n| self.names.iter().position(|x| x == n)) {
            tags.names |= 1 << bit;
        }
        tags
    }

    /// Whether `packet`, from a member tagged `from` to one tagged `to`, may open a flow:
    /// the first rule that matches, or the default.
    pub fn decide(&self, from: Tags, to: Tags, packet: &Packet) -> Decision {
        // ICMPv6 is what "icmp" means for IPv6.
        let proto = match (packet.proto, packet.src) {
            (proto::ICMPV6, IpAddr::V6(_)) => proto::ICMP,
            (p, _) => p,
        };
        for (i, rule) in self.rules.iter().enumerate() {
            if rule.proto.is_some_and(|p| p != proto) || !rule.ethertypes.is_empty() {
                continue;
            }
            if !rule.ports.is_empty()
                && !rule
                    .ports
                    .iter()
                    .any(|&(lo, hi)| (lo..=hi).contains(&packet.dport))
            {
                continue;
            }
            if rule.from.contains(from, packet.src) && rule.to.contains(to, packet.dst) {
                return Decision::Rule(i as u16);
            }
        }
        match self.default {
            DefaultAction::Allow => Decision::DefaultAllow,
            DefaultAction::Deny => Decision::DefaultDeny,
        }
    }
}

impl Policy {
    /// Whether a layer-2 frame carrying `ethertype` ([`crate::layer2::ethertype`]), from a
    /// member tagged `from` to one tagged `to`, passes: the first rule that matches (by
    /// members and EtherType; a rule naming IP flows matches no frame), or the default.
    /// Frames are decided one by one: there are no flows to remember.
    pub fn decide_frame(&self, from: Tags, to: Tags, ethertype: u16) -> Decision {
        let none = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        for (i, rule) in self.rules.iter().enumerate() {
            if rule.names_ip()
                || !(rule.ethertypes.is_empty() || rule.ethertypes.contains(&ethertype))
            {
                continue;
            }
            if rule.from.contains(from, none) && rule.to.contains(to, none) {
                return Decision::Rule(i as u16);
            }
        }
        match self.default {
            DefaultAction::Allow => Decision::DefaultAllow,
            DefaultAction::Deny => Decision::DefaultDeny,
        }
    }
}

/// A group or member name: what certificates allow (lowercase letters, digits, `-`, `_`,
/// `.`; at most 63 bytes).
fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}

/// `"5432"` or `"8000-8100"`, ports 1 to 65535, low to high.
fn parse_ports(text: &str) -> Option<(u16, u16)> {
    let (lo, hi) = match text.split_once('-') {
        Some((lo, hi)) => (
            lo.trim().parse::<u16>().ok()?,
            hi.trim().parse::<u16>().ok()?,
        ),
        None => {
            let p = text.trim().parse::<u16>().ok()?;
            (p, p)
        }
    };
    (lo >= 1 && lo <= hi).then_some((lo, hi))
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests6;
