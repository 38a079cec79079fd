//! What record values say once opened: the holder of an address, the address a name
//! stands for, and what a lease is on. Members read them; a replica of a namespace with an
//! authority reads only [`Subject`] ([`super::certified`]).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::{Deserialize, Serialize};

use super::RecordError;

/// What a lease is on, written inside its sealed value: a replica of a namespace with an
/// authority opens a claim and checks it against the owner's certificate
/// ([`super::certified`]). It names its key: a replica derives the key from it and compares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Subject {
    /// The lease on this virtual address ([`crate::NamespaceKeys::address_key`]).
    Address(Ipv4Addr),
    /// The lease on this IPv6 address ([`crate::NamespaceKeys::address6_key`]).
    Address6(Ipv6Addr),
    /// The lease on this host name ([`crate::NamespaceKeys::name_key`]).
    Name(String),
    /// A layer-2 namespace: the lease on this MAC ([`crate::NamespaceKeys::mac_key`]).
    Mac([u8; 6]),
}

/// The holder of a virtual address and where to reach it: the value of an address lease
/// (and of a member's entry in the broadcast group, without `subject`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    /// The member's underlay endpoints (its tunnel UDP socket), best first.
    pub endpoints: Vec<SocketAddr>,
    /// The host name held for this address (its PTR), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The address the lease is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Subject>,
}

/// The value of a name lease: the address the name stands for (an A record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameInfo {
    /// The address, one its owner holds.
    pub address: Ipv4Addr,
    /// A dual-stack member's own name: its IPv6 address too (AAAA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address6: Option<Ipv6Addr>,
    /// The name the lease is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Subject>,
}

/// Encodes a record plaintext.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing these plain structs to JSON cannot fail.
    serde_json::to_vec(value).unwrap_or_default()
}

/// Decodes a record plaintext.
pub fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, RecordError> {
    serde_json::from_slice(bytes).map_err(|_| RecordError::BadContent)
}
