//! The value syntaxes of the config that TOML does not have: durations and percentages.

use std::time::Duration;

/// Parses `500ms`, `2s`, `1.5s`, `1m`, `1h`: digits, an optional fraction, then a unit.
/// Returns `None` for anything else, including an overflow; zero is returned as such.
pub(super) fn parse_duration(text: &str) -> Option<Duration> {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let number_end = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(number_end);
    let unit_nanos: u128 = match unit {
        "ms" => 1_000_000,
        "s" => NANOS_PER_SEC,
        "m" => 60 * NANOS_PER_SEC,
        "h" => 3600 * NANOS_PER_SEC,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty()
        || (number.contains('.') && fraction.is_empty())
        || fraction.len() > 9
        || fraction.contains('.')
    {
        return None;
    }
    let whole: u128 = whole.parse().ok()?;
    let mut nanos = whole.checked_mul(unit_nanos)?;
    if !fraction.is_empty() {
        let digits: u128 = fraction.parse().ok()?;
        let scale = 10u128.pow(fraction.len() as u32);
        nanos = nanos.checked_add(digits * unit_nanos / scale)?;
    }
    let secs = u64::try_from(nanos / NANOS_PER_SEC).ok()?;
    // The remainder is below one second, so it fits in u32.
    Some(Duration::new(secs, (nanos % NANOS_PER_SEC) as u32))
}

/// Parses `10%` or `2.5%` into a fraction (0.1, 0.025).
pub(super) fn parse_percent(text: &str) -> Option<f64> {
    let number = text.trim().strip_suffix('%')?.trim_end();
    let well_formed = !number.is_empty()
        && number.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && number.bytes().filter(|&b| b == b'.').count() <= 1
        && !number.starts_with('.')
        && !number.ends_with('.');
    if !well_formed {
        return None;
    }
    number.parse::<f64>().ok().map(|n| n / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ms = Duration::from_millis;
        for (text, expected) in [
            ("500ms", Some(ms(500))),
            ("2s", Some(ms(2000))),
            ("1.5s", Some(ms(1500))),
            ("0.1s", Some(ms(100))),
            ("1m", Some(ms(60_000))),
            ("1.5m", Some(ms(90_000))),
            ("2h", Some(ms(7_200_000))),
            ("0s", Some(Duration::ZERO)),
            ("0.000000001s", Some(Duration::from_nanos(1))),
            ("1.5ms", Some(Duration::from_micros(1500))),
            ("2", None),
            ("2x", None),
            ("s", None),
            ("", None),
            (".5s", None),
            ("1.s", None),
            ("1..5s", None),
            ("1.2.3s", None),
            ("-1s", None),
            ("1 s", None),
            (" 1s", None),
            ("1S", None),
            ("1sec", None),
            ("1d", None),
            ("1e3ms", None),
            ("0.0000000001s", None),
            ("99999999999999999999999h", None),
            ("18446744073709551616s", None),
        ] {
            assert_eq!(parse_duration(text), expected, "{text:?}");
        }
    }

    #[test]
    fn percents() {
        assert_eq!(parse_percent("10%"), Some(0.1));
        assert_eq!(parse_percent("0%"), Some(0.0));
        assert_eq!(parse_percent("2.5%"), Some(0.025));
        for bad in ["10", "%", "1e1%", "inf%", ".5%", "5.%", "-5%", "1.2.3%"] {
            assert_eq!(parse_percent(bad), None, "{bad:?}");
        }
    }
}
