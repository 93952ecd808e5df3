//! Wall-clock times for people and for JSON: RFC 3339 in UTC, and `HH:MM:SS` for sentences;
//! and HTTP-dates read (`Retry-After`).
//!
//! A few lines of civil-calendar arithmetic (Howard Hinnant's `civil_from_days`) instead of a
//! date-time dependency; only UTC is ever written. HTTP-dates are read by `httpdate`, already
//! in the build through hyper.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`):
/// the inverse of [`civil_from_days`], which the tests check it against.
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The (year, month, day) of a day since 1970-01-01 (Howard Hinnant's `civil_from_days`).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

fn parts(time: SystemTime) -> (i64, u32, u32, u32, u32, u32, u32) {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = since.as_secs() as i64;
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400) as u32;
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

/// An HTTP-date in IMF-fixdate form (`Sun, 06 Nov 1994 08:49:37 GMT`, RFC 9110 5.6.7), the
/// only form a sender may generate; `None` for anything else: the obsolete forms, a weekday
/// that is not the date's, a day the month does not have, a year before 1970.
pub fn parse_http_date(text: &str) -> Option<SystemTime> {
    // httpdate also reads the obsolete forms (RFC 850, asctime) and trims spaces: only the
    // 29 bytes of IMF-fixdate, `Sun, ` first, are given to it.
    let b = text.as_bytes();
    if b.len() != 29 || b.get(3..5) != Some(b", ") {
        return None;
    }
    httpdate::parse_http_date(text).ok()
}

/// An HTTP-date in any of the three forms a recipient must accept (RFC 9110 5.6.7):
/// IMF-fixdate, and the obsolete RFC 850 (`Sunday, 06-Nov-94 08:49:37 GMT`, a two-digit year
/// below 70 read as 20xx, else 19xx) and asctime (`Sun Nov  6 08:49:37 1994`) forms; `None`
/// for anything else, spaces around it included.
pub fn parse_any_http_date(text: &str) -> Option<SystemTime> {
    // The longest form, RFC 850's with `Wednesday`, is 33 bytes.
    if text.len() > 40 || text.trim() != text {
        return None;
    }
    httpdate::parse_http_date(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_parse_and_anything_else_does_not() {
        let t = parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").expect("valid");
        assert_eq!(rfc3339(t), "1994-11-06T08:49:37.000Z");
        let leap = parse_http_date("Tue, 29 Feb 2000 00:00:00 GMT").expect("valid");
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
        let last = parse_http_date("Fri, 31 Dec 9999 23:59:59 GMT").expect("valid");
        assert_eq!(rfc3339(last), "9999-12-31T23:59:59.000Z");
        for bad in [
            "",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 06 Xyz 1994 08:49:37 GMT",
            "Sun, 99 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 28:49:37 GMT",
            "Sun, 0+ Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 GMT ",
            " Sun, 06 Nov 1994 08:49:37 GMT",
            "Mon, 06 Nov 1994 08:49:37 GMT",
            "Tue, 31 Feb 2000 00:00:00 GMT",
            "Wed, 31 Dec 1969 23:59:59 GMT",
            "Sun, 06 Nov 1994 08:49:60 GMT",
            "Sun,\u{a0}6 Nov 1994 08:49:37 GMT",
        ] {
            assert_eq!(parse_http_date(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_recipient_reads_all_three_http_date_forms() {
        let want = parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").expect("valid");
        for form in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(parse_any_http_date(form), Some(want), "{form:?}");
        }
        let later = parse_any_http_date("Thursday, 03-Dec-26 14:05:09 GMT").expect("valid");
        assert_eq!(rfc3339(later), "2026-12-03T14:05:09.000Z");
        for bad in [
            "",
            " Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 UTC",
            "Sun Nov 31 08:49:37 1994",
            "Monday, 06-Nov-94 08:49:37 GMT",
            "soon",
        ] {
            assert_eq!(parse_any_http_date(bad), None, "{bad:?}");
        }
    }

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
