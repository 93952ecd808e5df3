//! Agent checks (HAProxy's `agent-check`): a backend reports on a separate TCP port how it wants
//! to be treated, with one short line such as `up`, `down`, `drain`, `maint`, `ready` or a
//! weight `75%`. What it says changes eligibility and weight only, never the probe streaks or
//! the verdict: a backend the agent calls `up` is in rotation only if its health checks also
//! say UP.
//!
//! The line is words separated by commas, spaces or tabs, matched without regard to case:
//! - `up` and `ready` lift any hold; `down`, `fail` and `stopped` hold the backend out (shown
//!   `DOWN`, its verdict untouched); `drain` is a drain like `disable_on_404`'s: no new
//!   requests, in-flight ones finish (`SELF_DRAINING` while the verdict is UP); `maint` is
//!   maintenance, as HAProxy's agent `maint`: no probes, and on leaving it the backend
//!   requalifies (`rise_after_maintenance` passing probes) as after an operator's maintenance.
//!   Unlike HAProxy, `up` also lifts `drain`/`maint` (HAProxy needs `ready` for those).
//! - `N%` (0-100) sets the weight to N percent of the configured weight; `0%` holds the
//!   backend out like `drain`. Without a weight word the weight stays as the agent last set it.
//! - Other words (`maxconn:30`, ...) are ignored; a line with no word above, or with bytes that
//!   are not printable ASCII, is garbage: it changes nothing.
//!
//! When several state words appear, the last one wins. A failed agent exchange (refused, timed
//! out, garbage) changes nothing either: the backend keeps what its agent last said, as
//! HAProxy's agent failures never mark a server down. A manual override wins over the agent.

use std::fmt;
use std::time::Duration;

/// What an agent holds a backend out for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AgentHold {
    /// `down`, `fail` or `stopped`.
    Down,
    /// `drain`, or a weight of `0%`.
    Drain,
    /// `maint`.
    Maint,
}

impl AgentHold {
    /// `down`, `drain` or `maint`.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentHold::Down => "down",
            AgentHold::Drain => "drain",
            AgentHold::Maint => "maint",
        }
    }
}

/// One parsed agent line: the state word that won, if any, and the weight, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentReport {
    /// `Some(None)`: `up`/`ready`; `Some(Some(hold))`: a hold; `None`: no state word.
    pub state: Option<Option<AgentHold>>,
    /// The weight in percent of the configured weight (0-100), if the line set one.
    pub weight_percent: Option<u8>,
}

/// The longest agent line read, line ending included.
pub const MAX_AGENT_LINE: usize = 256;

impl AgentReport {
    /// Parses one line (without its line ending; one trailing `\r` is ignored). `None` for
    /// garbage: no known word, a byte that is not printable ASCII, or more than
    /// [`MAX_AGENT_LINE`] bytes. Never panics.
    pub fn parse(line: &[u8]) -> Option<AgentReport> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.len() > MAX_AGENT_LINE
            || !line
                .iter()
                .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b))
        {
            return None;
        }
        let mut report = AgentReport {
            state: None,
            weight_percent: None,
        };
        for word in line
            .split(|&b| b == b',' || b == b' ' || b == b'\t')
            .filter(|w| !w.is_empty())
        {
            let lower = word.to_ascii_lowercase();
            match lower.as_slice() {
                b"up" | b"ready" => report.state = Some(None),
                b"down" | b"fail" | b"stopped" => report.state = Some(Some(AgentHold::Down)),
                b"drain" => report.state = Some(Some(AgentHold::Drain)),
                b"maint" => report.state = Some(Some(AgentHold::Maint)),
                [digits @ .., b'%']
                    if (1..=3).contains(&digits.len()) && digits.iter().all(u8::is_ascii_digit) =>
                {
                    let n = digits
                        .iter()
                        .fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
                    if n <= 100 {
                        // At most 100.
                        report.weight_percent = Some(n as u8);
                    }
                }
                _ => {}
            }
        }
        (report.state.is_some() || report.weight_percent.is_some()).then_some(report)
    }
}

/// What a backend's agent last said: a hold, and a weight in percent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AgentState {
    /// The hold in force (`None`: the agent said `up`/`ready`, or nothing yet).
    pub hold: Option<AgentHold>,
    /// The weight in percent of the configured weight (100 until the agent sets one).
    pub weight_percent: u8,
}

impl Default for AgentState {
    fn default() -> AgentState {
        AgentState {
            hold: None,
            weight_percent: 100,
        }
    }
}

impl AgentState {
    /// The state after `report`.
    pub fn after(self, report: AgentReport) -> AgentState {
        AgentState {
            hold: report.state.unwrap_or(self.hold),
            weight_percent: report.weight_percent.unwrap_or(self.weight_percent),
        }
    }

    /// Whether the agent holds the backend out of rotation (a hold, or a weight of 0 %).
    pub fn holds_out(&self) -> bool {
        self.hold.is_some() || self.weight_percent == 0
    }

    /// `weight_tenths` scaled by the agent's weight (at least 1 while not held out).
    pub fn scale(&self, weight_tenths: u32) -> u32 {
        if self.weight_percent >= 100 {
            return weight_tenths;
        }
        let scaled = u64::from(weight_tenths) * u64::from(self.weight_percent) / 100;
        // At most `weight_tenths`, which is a u32.
        (scaled as u32).max(1)
    }
}

impl fmt::Display for AgentState {
    /// `up`, `down`, `drain`, `maint`, with `, weight 75%` when not 100 %.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.hold {
            Some(hold) => f.write_str(hold.as_str())?,
            None if self.weight_percent == 0 => f.write_str("drain")?,
            None => f.write_str("up")?,
        }
        if self.weight_percent != 100 {
            write!(f, ", weight {}%", self.weight_percent)?;
        }
        Ok(())
    }
}

/// What an agent's answer changed for one backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentChange {
    /// The backend's index in the pool.
    pub backend: usize,
    /// What the agent said before.
    pub from: AgentState,
    /// What it says now.
    pub to: AgentState,
    /// Whether the backend is in rotation by its own standing after the change.
    pub in_rotation: bool,
    /// When, on the caller's clock.
    pub at: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Option<AgentReport> {
        AgentReport::parse(line.as_bytes())
    }

    #[test]
    fn agent_lines() {
        let held = |hold| {
            Some(AgentReport {
                state: Some(Some(hold)),
                weight_percent: None,
            })
        };
        assert_eq!(parse("down"), held(AgentHold::Down));
        assert_eq!(parse("DOWN\r"), held(AgentHold::Down));
        assert_eq!(parse("stopped"), held(AgentHold::Down));
        assert_eq!(parse("drain"), held(AgentHold::Drain));
        assert_eq!(parse("maint"), held(AgentHold::Maint));
        assert_eq!(
            parse("75%"),
            Some(AgentReport {
                state: None,
                weight_percent: Some(75)
            })
        );
        assert_eq!(
            parse("up, 50% maxconn:10"),
            Some(AgentReport {
                state: Some(None),
                weight_percent: Some(50)
            })
        );
        assert_eq!(parse("down ready").unwrap().state, Some(None));
        for garbage in [
            "",
            "hello",
            "101%",
            "1000%",
            "%",
            "up\u{7}",
            "caf\u{e9}",
            "-5%",
        ] {
            assert_eq!(parse(garbage), None, "{garbage:?}");
        }
        assert_eq!(AgentReport::parse(&[b'u'; 300]), None);
    }

    #[test]
    fn state_keeps_what_a_report_does_not_say() {
        let state = AgentState::default().after(parse("50%").unwrap());
        assert_eq!(state.to_string(), "up, weight 50%");
        let state = state.after(parse("drain").unwrap());
        assert_eq!(state.to_string(), "drain, weight 50%");
        assert!(state.holds_out());
        let state = state.after(parse("ready").unwrap());
        assert!(!state.holds_out());
        assert_eq!(state.scale(10), 5);
        assert_eq!(
            AgentState {
                hold: None,
                weight_percent: 1
            }
            .scale(10),
            1
        );
        assert!(AgentState {
            hold: None,
            weight_percent: 0
        }
        .holds_out());
    }
}
