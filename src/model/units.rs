//! Byte quantities as administrators write them (`16Gi`, `500M`, `1048576`) and as pinboard prints them;
//! durations as they write them (`30s`, `10m`, `1h`); rates of a link (`6MiB/s`, `50Mbit/s`).

use std::time::Duration;

use humansize::{BINARY, format_size};

/// A quantity or a duration written in a way pinboard does not read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UnitsError {
    #[error("{text:?} is not a byte quantity: write e.g. 16Gi, 500Mi, 2G or 1048576")]
    NotBytes { text: String },
    #[error("{text:?} is not a duration: write e.g. 30s, 10m or 1h")]
    NotDuration { text: String },
    #[error("{text:?} is not a rate: write e.g. 6MiB/s, 500KiB/s, 50Mbit/s or 1Gbit/s")]
    NotRate { text: String },
}

/// Parses a Kubernetes-style quantity of bytes: a whole number with an optional suffix
/// `Ki Mi Gi Ti Pi` (powers of 1024) or `k K M G T P` (powers of 1000).
pub fn parse_bytes(text: &str) -> Result<u64, UnitsError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let bad = || UnitsError::NotBytes {
        text: text.to_owned(),
    };
    let number: u64 = number.parse().map_err(|_| bad())?;
    let multiplier: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        _ => return Err(bad()),
    };
    number.checked_mul(multiplier).ok_or_else(bad)
}

/// Parses a duration: a whole number with the unit `s`, `m` or `h` (`30s`, `10m`, `1h`); a bare number is
/// seconds.
pub fn parse_duration(text: &str) -> Result<Duration, UnitsError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let bad = || UnitsError::NotDuration {
        text: text.to_owned(),
    };
    let number: u64 = number.parse().map_err(|_| bad())?;
    let seconds: u64 = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return Err(bad()),
    };
    number
        .checked_mul(seconds)
        .map(Duration::from_secs)
        .ok_or_else(bad)
}

/// Parses a rate in bytes per second: a whole number of bytes as [`parse_bytes`] reads them, with `B` or
/// `iB` allowed after the suffix (`6MiB/s`, `500KB/s`, `6Mi`), or of bits (`50Mbit/s`, `1Gbit/s`,
/// `800kbit/s`: powers of 1000, as lines are sold); `/s` is optional. Zero is refused.
pub fn parse_rate(text: &str) -> Result<u64, UnitsError> {
    let bad = || UnitsError::NotRate {
        text: text.trim().to_owned(),
    };
    let quantity = text.trim();
    let quantity = quantity.strip_suffix("/s").unwrap_or(quantity);
    let rate = match quantity.strip_suffix("bit") {
        Some(bits) => {
            let multiplier = match bits.trim_start_matches(|c: char| c.is_ascii_digit()) {
                "" => 1,
                "k" | "K" => 1_000,
                "M" => 1_000_000,
                "G" => 1_000_000_000,
                _ => return Err(bad()),
            };
            let number =
                &bits[..bits.len() - bits.trim_start_matches(|c: char| c.is_ascii_digit()).len()];
            let number: u64 = number.parse().map_err(|_| bad())?;
            number.checked_mul(multiplier).ok_or_else(bad)? / 8
        }
        None => {
            let bytes = quantity.strip_suffix('B').unwrap_or(quantity);
            let bytes = bytes
                .strip_suffix("iB")
                .map_or(bytes.to_string(), |b| format!("{b}i"));
            parse_bytes(&bytes).map_err(|_| bad())?
        }
    };
    match rate {
        0 => Err(bad()),
        rate => Ok(rate),
    }
}

/// A rate for people: `6 MiB/s`.
pub fn human_rate(bytes_per_second: u64) -> String {
    format!("{}/s", human(bytes_per_second))
}

/// A duration for people: `1h02m`, `3m05s`, `42s`.
pub fn clock(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// Bytes for people: `1.50 GiB`.
pub fn human(bytes: u64) -> String {
    format_size(bytes, BINARY)
}

/// Signed bytes for people, for figures that can go negative (space left after a plan).
pub fn human_signed(bytes: i64) -> String {
    if bytes < 0 {
        format!("-{}", human(bytes.unsigned_abs()))
    } else {
        human(bytes as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_and_decimal_suffixes() {
        assert_eq!(parse_bytes("16Gi"), Ok(16 << 30));
        assert_eq!(parse_bytes("500Mi"), Ok(500 << 20));
        assert_eq!(parse_bytes("2G"), Ok(2_000_000_000));
        assert_eq!(parse_bytes(" 1048576 "), Ok(1_048_576));
        assert!(
            parse_bytes("16GB")
                .unwrap_err()
                .to_string()
                .contains("16Gi")
        );
        assert!(parse_bytes("Gi").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("99999999999Pi").is_err());
    }

    #[test]
    fn parses_durations_in_seconds_minutes_and_hours() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration(" 45 "), Ok(Duration::from_secs(45)));
        assert!(
            parse_duration("10 min")
                .unwrap_err()
                .to_string()
                .contains("10m")
        );
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("1.5h").is_err());
        assert!(parse_duration("99999999999999999h").is_err());
    }

    #[test]
    fn parses_rates_of_bytes_and_of_bits() {
        assert_eq!(parse_rate("6MiB/s"), Ok(6 << 20));
        assert_eq!(parse_rate("6Mi"), Ok(6 << 20));
        assert_eq!(parse_rate("500KB/s"), Ok(500_000));
        assert_eq!(parse_rate("4096"), Ok(4096));
        assert_eq!(parse_rate("50Mbit/s"), Ok(6_250_000));
        assert_eq!(parse_rate("1Gbit/s"), Ok(125_000_000));
        assert_eq!(parse_rate(" 800kbit "), Ok(100_000));
        for bad in [
            "0", "0MiB/s", "fast", "6 MiB/s", "1.5MiB/s", "50Mb/s", "Mbit/s", "6MiB/h",
        ] {
            let error = parse_rate(bad).unwrap_err().to_string();
            assert!(error.contains("6MiB/s"), "{bad}: {error}");
        }
        assert_eq!(human_rate(6 << 20), "6 MiB/s");
    }

    #[test]
    fn prints_binary_units() {
        assert_eq!(human(1536 << 20), "1.50 GiB");
        assert_eq!(human_signed(-(1 << 20)), "-1 MiB");
    }
}
