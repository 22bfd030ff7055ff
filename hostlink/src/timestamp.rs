//! RFC 3339 UTC timestamps for HostLink records. Owns the one text form records carry
//! (`YYYY-MM-DDTHH:MM:SS[.fraction]Z`, UTC only, `Z` only) and its strict parse. Never reads a
//! clock.
//!
//! Encoding is canonical: the fraction is omitted when zero, else written with 3, 6 or 9
//! digits (the fewest that keep the value). Parsing accepts 1 to 9 fraction digits, refuses
//! offsets other than `Z`, leap seconds, impossible dates and years outside 0000–9999.

use std::fmt;

use sessionstore::Millis;

/// An instant in UTC with nanosecond precision, within years 0000–9999.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    /// Seconds since the Unix epoch (negative before 1970).
    secs: i64,
    /// Nanoseconds within the second, `0..1_000_000_000`.
    nanos: u32,
}

/// Why text is not an RFC 3339 UTC timestamp.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("not an RFC 3339 UTC timestamp: {0}")]
pub struct TimestampError(&'static str);

const SECS_PER_DAY: i64 = 86_400;
/// 0000-01-01T00:00:00Z.
const MIN_SECS: i64 = -62_167_219_200;
/// 9999-12-31T23:59:59Z.
const MAX_SECS: i64 = 253_402_300_799;

/// Days since 1970-01-01 of a proleptic Gregorian date (`month` 1–12).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    // Shift the year so it starts in March: the leap day is then the year's last day.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let m = i64::from(month);
    let shifted_month = if m > 2 { m - 3 } else { m + 9 };
    let day_of_year = (153 * shifted_month + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The (year, month, day) of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        2 => 28,
        _ => 0,
    }
}

impl Timestamp {
    /// From milliseconds since the Unix epoch (the session store's clock unit); `None` outside
    /// years 0000–9999.
    pub fn from_unix_millis(ms: Millis) -> Option<Timestamp> {
        let secs = ms.div_euclid(1000);
        let nanos = (ms.rem_euclid(1000) as u32) * 1_000_000;
        Timestamp::from_parts(secs, nanos)
    }

    /// From seconds and nanoseconds since the Unix epoch; `None` when out of range.
    pub fn from_parts(secs: i64, nanos: u32) -> Option<Timestamp> {
        if !(MIN_SECS..=MAX_SECS).contains(&secs) || nanos >= 1_000_000_000 {
            return None;
        }
        Some(Timestamp { secs, nanos })
    }

    /// Milliseconds since the Unix epoch (sub-millisecond digits truncated toward the past).
    pub fn unix_millis(self) -> Millis {
        self.secs * 1000 + i64::from(self.nanos / 1_000_000)
    }

    /// Seconds since the Unix epoch.
    pub fn unix_secs(self) -> i64 {
        self.secs
    }

    /// Nanoseconds within the second.
    pub fn subsec_nanos(self) -> u32 {
        self.nanos
    }

    /// Parses the strict form described in the module documentation.
    pub fn parse(text: &str) -> Result<Timestamp, TimestampError> {
        let b = text.as_bytes();
        if b.len() < 20 {
            return Err(TimestampError("too short"));
        }
        let digits = |from: usize, to: usize| -> Result<u32, TimestampError> {
            let mut n = 0u32;
            for &c in &b[from..to] {
                if !c.is_ascii_digit() {
                    return Err(TimestampError("expected a digit"));
                }
                n = n * 10 + u32::from(c - b'0');
            }
            Ok(n)
        };
        let year = i64::from(digits(0, 4)?);
        if b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':' {
            return Err(TimestampError("expected YYYY-MM-DDTHH:MM:SS"));
        }
        let month = digits(5, 7)?;
        let day = digits(8, 10)?;
        let hour = digits(11, 13)?;
        let minute = digits(14, 16)?;
        let second = digits(17, 19)?;
        if !(1..=12).contains(&month) {
            return Err(TimestampError("month out of range"));
        }
        if day == 0 || day > days_in_month(year, month) {
            return Err(TimestampError("day out of range"));
        }
        if hour > 23 || minute > 59 || second > 59 {
            return Err(TimestampError("time of day out of range"));
        }
        let mut i = 19;
        let mut nanos = 0u32;
        if b[i] == b'.' {
            i += 1;
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            let count = i - start;
            if count == 0 || count > 9 {
                return Err(TimestampError("a fraction has 1 to 9 digits"));
            }
            nanos = digits(start, i)? * 10u32.pow((9 - count) as u32);
        }
        if i + 1 != b.len() || b[i] != b'Z' {
            return Err(TimestampError("must end with Z (UTC)"));
        }
        let days = days_from_civil(year, month, day);
        let secs = days * SECS_PER_DAY
            + i64::from(hour) * 3600
            + i64::from(minute) * 60
            + i64::from(second);
        Timestamp::from_parts(secs, nanos).ok_or(TimestampError("out of range"))
    }
}

impl serde::Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Timestamp::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let days = self.secs.div_euclid(SECS_PER_DAY);
        let in_day = self.secs.rem_euclid(SECS_PER_DAY);
        let (year, month, day) = civil_from_days(days);
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
            in_day / 3600,
            (in_day % 3600) / 60,
            in_day % 60
        )?;
        if self.nanos != 0 {
            if self.nanos.is_multiple_of(1_000_000) {
                write!(f, ".{:03}", self.nanos / 1_000_000)?;
            } else if self.nanos.is_multiple_of(1000) {
                write!(f, ".{:06}", self.nanos / 1000)?;
            } else {
                write!(f, ".{:09}", self.nanos)?;
            }
        }
        f.write_str("Z")
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_instants_format_as_rfc3339_utc() {
        let t = Timestamp::from_unix_millis(0).unwrap();
        assert_eq!(t.to_string(), "1970-01-01T00:00:00Z");
        let t = Timestamp::from_unix_millis(1_700_000_000_123).unwrap();
        assert_eq!(t.to_string(), "2023-11-14T22:13:20.123Z");
        let t = Timestamp::from_unix_millis(-1).unwrap();
        assert_eq!(t.to_string(), "1969-12-31T23:59:59.999Z");
        assert_eq!(
            Timestamp::parse("2024-02-29T12:00:00.5Z")
                .unwrap()
                .to_string(),
            "2024-02-29T12:00:00.500Z"
        );
        assert_eq!(
            Timestamp::parse("0000-01-01T00:00:00Z")
                .unwrap()
                .unix_secs(),
            MIN_SECS
        );
        assert_eq!(
            Timestamp::parse("9999-12-31T23:59:59.999999999Z")
                .unwrap()
                .unix_secs(),
            MAX_SECS
        );
    }

    #[test]
    fn offsets_leap_seconds_impossible_dates_and_loose_forms_are_refused() {
        for bad in [
            "2023-11-14T22:13:20+00:00",
            "2023-11-14T22:13:20z",
            "2023-11-14 22:13:20Z",
            "2023-11-14T22:13:60Z",
            "2023-02-29T00:00:00Z",
            "2023-13-01T00:00:00Z",
            "2023-00-01T00:00:00Z",
            "2023-11-14T24:00:00Z",
            "2023-11-14T22:13:20.Z",
            "2023-11-14T22:13:20.1234567890Z",
            "2023-11-14T22:13:20Z ",
            "+2023-11-14T22:13:20Z",
            "2023-1-14T22:13:20Z",
            "",
        ] {
            assert!(Timestamp::parse(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn every_instant_round_trips(secs in MIN_SECS..=MAX_SECS, nanos in 0u32..1_000_000_000) {
            let t = Timestamp::from_parts(secs, nanos).unwrap();
            prop_assert_eq!(Timestamp::parse(&t.to_string()), Ok(t));
        }

        #[test]
        fn parsing_arbitrary_text_never_panics(text in ".{0,40}") {
            let _ = Timestamp::parse(&text);
        }
    }
}
