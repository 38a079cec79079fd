//! A router's LAN ports in the config: `lan_ports` ("veb" or "vepa") and VEPA's optional
//! static address table `lan_table` (docs/MODES.md, "VEB and VEPA ports").

use std::net::Ipv4Addr;

use anyhow::{bail, Context, Result};
use hyphae_vswitch::{LanPorts, Mac, MAX_LAN_HOSTS};
use ipnet::Ipv4Net;
use serde::Deserialize;

use super::{Mode, NamespaceSection};

/// One row of `lan_table`: a LAN host's address and the MAC it sends from.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LanTableRow {
    address: String,
    mac: String,
}

/// `lan_ports` and `lan_table` of a namespace in `mode` whose subnet is `subnet` (if
/// known): VEB by default; a table needs VEPA, and both need router mode.
pub(super) fn parse_lan_ports(
    s: &NamespaceSection,
    mode: Mode,
    subnet: Option<Ipv4Net>,
) -> Result<(LanPorts, Vec<(Ipv4Addr, Mac)>)> {
    let ports = match s.lan_ports.as_deref() {
        None | Some("veb") => LanPorts::Veb,
        Some("vepa") => LanPorts::Vepa,
        Some(other) => bail!("lan_ports '{other}' is not \"veb\" or \"vepa\""),
    };
    if s.lan_ports.is_some() && mode != Mode::Router {
        bail!("`lan_ports` needs mode = \"router\" (the ports of a router's LAN bridge)");
    }
    if !s.lan_table.is_empty() && ports != LanPorts::Vepa {
        bail!("`lan_table` needs lan_ports = \"vepa\" (VEB ports are not checked)");
    }
    if s.lan_table.len() > MAX_LAN_HOSTS {
        bail!(
            "lan_table has {} rows; at most {MAX_LAN_HOSTS}",
            s.lan_table.len()
        );
    }
    let mut table: Vec<(Ipv4Addr, Mac)> = Vec::with_capacity(s.lan_table.len());
    for row in &s.lan_table {
        let address: Ipv4Addr = row
            .address
            .parse()
            .with_context(|| format!("lan_table: '{}' is not an IPv4 address", row.address))?;
        let mac = parse_mac(&row.mac).with_context(|| format!("lan_table row {address}"))?;
        if let Some(net) = subnet {
            if !net.contains(&address) {
                bail!("lan_table: {address} is outside this member's subnet {net}");
            }
        }
        if table.iter().any(|(a, _)| *a == address) {
            bail!("lan_table lists {address} twice");
        }
        table.push((address, mac));
    }
    Ok((ports, table))
}

/// A unicast MAC written `aa:bb:cc:dd:ee:ff` (or with `-`).
fn parse_mac(text: &str) -> Result<Mac> {
    let bytes: Vec<&str> = text.split([':', '-']).collect();
    let mut mac = [0u8; 6];
    let ok = bytes.len() == 6
        && bytes
            .iter()
            .zip(&mut mac)
            .all(|(b, m)| b.len() == 2 && u8::from_str_radix(b, 16).map(|v| *m = v).is_ok());
    if !ok {
        bail!("'{text}' is not a MAC address (aa:bb:cc:dd:ee:ff)");
    }
    if mac[0] & 1 != 0 || mac == [0; 6] {
        bail!("{text} is not a host's MAC (a group or zero address)");
    }
    Ok(mac)
}

#[cfg(test)]
mod tests {
    use super::parse_mac;

    #[test]
    fn macs_are_parsed_and_group_addresses_refused() {
        assert_eq!(
            parse_mac("02:00:0a:0B:0c:ff").unwrap(),
            [2, 0, 0x0a, 0x0b, 0x0c, 0xff]
        );
        assert_eq!(parse_mac("02-00-00-00-00-01").unwrap(), [2, 0, 0, 0, 0, 1]);
        for bad in [
            "",
            "02:00:00:00:00",
            "02:00:00:00:00:0g",
            "020:0:00:00:00:01",
            "01:00:5e:00:00:01",
            "00:00:00:00:00:00",
        ] {
            assert!(parse_mac(bad).is_err(), "{bad}");
        }
    }
}
