//! Frames too large for one tunnel packet: cut into pieces on the way out, put back
//! together in order on the way in, bounded and counted.

use std::time::Instant;

use super::*;

/// What a piece made of its frame.
pub(super) enum Gathered {
    /// More pieces are to come.
    Held,
    /// The piece cannot be used (counted by the caller).
    Dropped,
    /// The last piece: the frame's bytes, EtherIP header first.
    Done(Vec<u8>),
}

/// A frame being put back together from its pieces, which must come in order.
#[derive(Debug)]
pub(super) struct Partial<P> {
    pub(super) from: P,
    pub(super) id: u16,
    pub(super) bytes: Vec<u8>,
    pub(super) deadline: Instant,
}

impl<P: Copy + Eq + std::hash::Hash> Layer2<P> {
    /// How to send a frame of `frame_len` bytes: `None` whole, in one envelope; else in
    /// these pieces (counted, with a fresh identification).
    pub fn pieces(&mut self, frame_len: usize) -> Option<Pieces> {
        if ENVELOPE_LEN + frame_len <= self.config.tunnel_mtu {
            return None;
        }
        let pieces = Pieces::new(frame_len, self.config.tunnel_mtu, self.next_id)?;
        self.next_id = self.next_id.wrapping_add(1);
        self.counters.fragmented += 1;
        Some(pieces)
    }

    /// The frame the last [`Layer2::handle_peer_piece`] that answered
    /// [`L2Action::ToTap`] put back together.
    pub fn assembled(&self) -> &[u8] {
        &self.assembled
    }

    /// Handles a piece of a frame from member `from` at `now` (as [`parse_envelope`] read
    /// it). Pieces must come in order; the whole frame, once there, must come from a MAC
    /// the member announced, and then goes as [`Layer2::handle_peer_frame`] says (a frame
    /// for the TAP is [`Layer2::assembled`]).
    /// `allow` is asked about the whole frame before the switch takes it (the namespace's
    /// policy): a frame it refuses teaches the switch nothing.
    pub fn handle_peer_piece(
        &mut self,
        now: Instant,
        from: P,
        piece: Piece<'_>,
        allow: impl FnOnce(&[u8]) -> bool,
    ) -> L2Action<P> {
        let mut bytes = match self.gather(now, from, piece) {
            Gathered::Held => return L2Action::Held,
            Gathered::Dropped => return self.reassembly_drop(),
            Gathered::Done(bytes) => bytes,
        };
        // The node checks a whole frame's source; a reassembled one is checked here, against
        // the same announcement.
        let src = bytes.get(8..14).and_then(|s| <Mac>::try_from(s).ok());
        let announced = src.is_some_and(|s| {
            self.announced
                .get(&from)
                .is_some_and(|list| list.binary_search(&s).is_ok())
        });
        if bytes.get(..2) != Some(&ETHERIP_HEADER[..]) || !announced {
            return self.reassembly_drop();
        }
        self.counters.reassembled += 1;
        bytes.drain(..2);
        if !allow(&bytes) {
            self.count_denied(false);
            return L2Action::Drop(L2Drop::Policy);
        }
        let action = self.handle_peer_frame(now, from, &bytes);
        self.assembled = bytes;
        action
    }

    pub(super) fn reassembly_drop(&mut self) -> L2Action<P> {
        self.counters.drops[L2Drop::Reassembly.index()] += 1;
        L2Action::Drop(L2Drop::Reassembly)
    }

    /// Adds a piece to its frame.
    pub(super) fn gather(&mut self, now: Instant, from: P, piece: Piece<'_>) -> Gathered {
        let Piece {
            id,
            offset,
            more,
            payload,
        } = piece;
        self.expire(now);
        let at = self
            .partials
            .iter()
            .position(|p| p.from == from && p.id == id);
        let k = match at {
            Some(k) if self.partials[k].bytes.len() == offset => k,
            Some(k) => {
                // Out of order (or again): the frame cannot be put together.
                self.partials.remove(k);
                return Gathered::Dropped;
            }
            // A later piece of a frame whose first was lost, dropped or came late.
            None if offset != 0 => return Gathered::Dropped,
            None => {
                // Two workers may send a member's frames at once, so their pieces may
                // interleave: a member has up to MAX_REASSEMBLIES_PER_MEMBER frames under
                // way, and a further one replaces its oldest.
                let mine = self.partials.iter().filter(|p| p.from == from).count();
                if mine >= MAX_REASSEMBLIES_PER_MEMBER {
                    if let Some(old) = self.partials.iter().position(|p| p.from == from) {
                        self.partials.remove(old);
                        self.counters.drops[L2Drop::Reassembly.index()] += 1;
                    }
                }
                if self.partials.len() >= MAX_REASSEMBLIES {
                    return Gathered::Dropped;
                }
                self.partials.push(Partial {
                    from,
                    id,
                    bytes: Vec::new(),
                    deadline: now + REASSEMBLY_TIMEOUT,
                });
                self.partials.len() - 1
            }
        };
        let partial = &mut self.partials[k];
        if partial.bytes.len() + payload.len() > 2 + MAX_FRAME {
            self.partials.remove(k);
            return Gathered::Dropped;
        }
        partial.bytes.extend_from_slice(payload);
        if more {
            return Gathered::Held;
        }
        Gathered::Done(self.partials.remove(k).bytes)
    }

    /// Drops frames whose pieces did not all come in time (counted).
    pub(super) fn expire(&mut self, now: Instant) {
        let before = self.partials.len();
        self.partials.retain(|p| p.deadline > now);
        self.counters.drops[L2Drop::Reassembly.index()] += (before - self.partials.len()) as u64;
    }
}
