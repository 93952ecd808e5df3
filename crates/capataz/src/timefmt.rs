//! Wall-clock times for people and for JSON: RFC 3339 in UTC, and `HH:MM:SS` for sentences.
//!
//! A few lines of civil-calendar arithmetic (Howard Hinnant's `civil_from_days`) instead of a
//! date-time dependency; only UTC is ever written.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn parts(time: SystemTime) -> (i64, u32, u32, u32, u32, u32, u32) {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = since.as_secs() as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400) as u32;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        month,
        day,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis(),
    )
}

/// `2026-11-29T14:05:09.123Z`.
pub fn rfc3339(time: SystemTime) -> String {
    let (y, mo, d, h, mi, s, ms) = parts(time);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z")
}

/// `14:05:09` (UTC), for sentences.
pub fn clock(time: SystemTime) -> String {
    let (_, _, _, h, mi, s, _) = parts(time);
    format!("{h:02}:{mi:02}:{s:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_796_306_709_123);
        assert_eq!(rfc3339(t), "2026-12-03T14:05:09.123Z");
        assert_eq!(clock(t), "14:05:09");
        // A leap day.
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }
}
