//! A VLAN trunk: a namespace's frames untagged on the way in, tagged on the way out.

use super::*;

/// 802.1Q's tag protocol identifier.
pub const TPID_8021Q: u16 = 0x8100;

/// Bytes of an 802.1Q tag.
pub const VLAN_TAG_LEN: usize = 4;

/// Writes `frame` tagged with VLAN `vid` (priority 0) into `out`, which must hold
/// `frame.len() + VLAN_TAG_LEN` bytes; its length, or `None` if either is too short.
pub fn tag_into(out: &mut [u8], frame: &[u8], vid: u16) -> Option<usize> {
    let len = frame.len() + VLAN_TAG_LEN;
    let out = out.get_mut(..len)?;
    out[..12].copy_from_slice(frame.get(..12)?);
    out[12..14].copy_from_slice(&TPID_8021Q.to_be_bytes());
    out[14..16].copy_from_slice(&(vid & 0x0fff).to_be_bytes());
    out[16..].copy_from_slice(&frame[12..]);
    Some(len)
}

/// Moves the frame of `len` bytes at `buf[start..]` to the front of `buf`, tagged with
/// VLAN `vid`; `start` must leave room for the tag (at least [`VLAN_TAG_LEN`]). The tagged
/// frame's length, or `None` if `buf` is too short.
pub fn tag_in_place(buf: &mut [u8], start: usize, len: usize, vid: u16) -> Option<usize> {
    if start < VLAN_TAG_LEN || len < ETH_HEADER_LEN || buf.len() < start + len {
        return None;
    }
    // The MACs first (their new place ends before the frame starts), then the rest,
    // which may overlap its old place.
    buf.copy_within(start..start + 12, 0);
    buf.copy_within(start + 12..start + len, 12 + VLAN_TAG_LEN);
    buf[12..14].copy_from_slice(&TPID_8021Q.to_be_bytes());
    buf[14..16].copy_from_slice(&(vid & 0x0fff).to_be_bytes());
    Some(len + VLAN_TAG_LEN)
}

impl<P: Copy + Eq + std::hash::Hash> Layer2<P> {
    /// On a trunk ([`L2Config::vlan`]): the frame of this namespace's VLAN with its tag
    /// taken off (in place: the MACs move up by the tag's length), or `None` for another
    /// VLAN's or an untagged frame (counted). Without a VLAN: the frame as it is.
    pub fn untag<'a>(&mut self, frame: &'a mut [u8]) -> Option<&'a mut [u8]> {
        let Some(vid) = self.config.vlan else {
            return Some(frame);
        };
        let ours = frame.len() >= ETH_HEADER_LEN + VLAN_TAG_LEN
            && frame[12..14] == TPID_8021Q.to_be_bytes()
            && u16::from_be_bytes([frame[14], frame[15]]) & 0x0fff == vid;
        if !ours {
            self.counters.drops[L2Drop::OtherVlan.index()] += 1;
            return None;
        }
        frame.copy_within(..12, VLAN_TAG_LEN);
        Some(&mut frame[VLAN_TAG_LEN..])
    }
}
