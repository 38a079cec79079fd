//! Progress of long CLI operations on stderr: on a terminal one line that updates in place
//! behind a spinner; otherwise (a log, a pipe, a test) each step once, as a plain line.

use std::io::{IsTerminal as _, Write as _};

use crate::control::Status;

const SPINNER: [char; 4] = ['|', '/', '-', '\\'];

/// Reports the steps of one operation (`label`: what it is, e.g. "join lab").
#[derive(Debug)]
pub(crate) struct Progress {
    label: String,
    tty: bool,
    last: Option<String>,
    turn: usize,
}

impl Progress {
    pub(crate) fn new(label: impl Into<String>) -> Self {
        Self {
            label: label.into(),
            tty: std::io::stderr().is_terminal(),
            last: None,
            turn: 0,
        }
    }

    /// The operation is at `step`: a new plain line when it changed; on a terminal the
    /// spinner turns on every call.
    pub(crate) fn step(&mut self, step: &str) {
        let changed = self.last.as_deref() != Some(step);
        let mut err = std::io::stderr().lock();
        if self.tty {
            self.turn += 1;
            let spin = SPINNER[self.turn % SPINNER.len()];
            let _ = write!(err, "\r\x1b[2K{spin} {}: {step}", self.label);
            let _ = err.flush();
        } else if changed {
            let _ = writeln!(err, "{}: {step}", self.label);
        }
        if changed {
            self.last = Some(step.to_string());
        }
    }

    /// Ends the updating line (a terminal's); the result follows on a clean line.
    pub(crate) fn finish(&mut self) {
        if self.tty && self.last.is_some() {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}

/// Where a join of `namespace` is, read from the agent's status: reaching a member of the
/// overlay, the namespace record, the address claim.
pub(crate) fn join_step(status: &Status, namespace: &str) -> String {
    let Some(ns) = status.namespaces.iter().find(|n| n.name == namespace) else {
        return "waiting for the agent to take the namespace up".into();
    };
    if !status.overlay.joined {
        return match status.overlay.connected {
            0 => "joining the overlay (reaching a member)".into(),
            n => format!("first member reached ({n} connected); joining the overlay"),
        };
    }
    if ns.subnet.is_empty() {
        return "waiting for the namespace record".into();
    }
    if !ns.address_claimed {
        return match &ns.address_error {
            Some(e) => format!("claiming an address ({e})"),
            None => "claiming an address".into(),
        };
    }
    "address held".into()
}
