//! What `dhcproto` 0.15 may be given to decode: a walk of a message's options that refuses
//! the lengths its decoders mishandle.

/// Whether every option of `options` (and of the options nested in them) has a length that
/// `dhcproto` 0.15 decodes without harm: its decoders of Status Code, Vendor Class and
/// Vendor-specific Information subtract a fixed size from the option's length unchecked (a
/// shorter one panics with overflow checks on, as the fuzzer found); those of fixed-size
/// options read their size whatever the length says (so a wrong length shifts every option
/// after it, past what this walk checked); and a relay message nests a whole message. Such
/// options are refused here with the message.
pub(super) fn options_sound(mut options: &[u8], depth: u8) -> bool {
    if depth > 4 {
        return false;
    }
    while !options.is_empty() {
        let Some(head) = options.get(..4) else {
            return false;
        };
        let code = u16::from_be_bytes([head[0], head[1]]);
        let len = usize::from(u16::from_be_bytes([head[2], head[3]]));
        let Some(body) = options.get(4..4 + len) else {
            return false;
        };
        let exact = match code {
            // Preference, Elapsed Time, Server Unicast, Rapid Commit, Reconfigure Message,
            // Reconfigure Accept.
            7 | 19 => Some(1),
            8 => Some(2),
            12 => Some(16),
            14 | 20 => Some(0),
            _ => None,
        };
        if exact.is_some_and(|n| n != len) {
            return false;
        }
        let (least, nested) = match code {
            // IA_NA, IA_PD: IAID, T1, T2, then options.
            3 | 25 => (0, body.get(12..)),
            // IA_TA: IAID, then options.
            4 => (0, body.get(4..)),
            // IAADDR: address and two lifetimes; IAPREFIX: two lifetimes, length, prefix.
            5 => (0, body.get(24..)),
            26 => (0, body.get(25..)),
            // Relay message: not served.
            9 => return false,
            // Authentication, Status Code, Vendor Class.
            11 => (11, None),
            13 => (2, None),
            16 => (4, None),
            // Vendor-specific Information: enterprise number, then options.
            17 => (4, body.get(4..)),
            _ => (0, None),
        };
        if len < least || nested.is_some_and(|n| !options_sound(n, depth + 1)) {
            return false;
        }
        options = &options[4 + len..];
    }
    true
}
