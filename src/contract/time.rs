//! Dates as every stored document has them: RFC 3339 UTC, second precision.

/// Now as RFC 3339 UTC with second precision, the one format every stored date uses.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Normalises a date (`YYYY-MM-DD`, RFC 3339 with any offset, or unix seconds) to RFC 3339 UTC.
pub fn normalize_date(text: &str) -> Option<String> {
    let text = text.trim();
    if let Ok(dt) = chrono::DateTime::parse_from_rfc3339(text) {
        return Some(dt.with_timezone(&chrono::Utc).format("%Y-%m-%dT%H:%M:%SZ").to_string());
    }
    if let Ok(date) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Some(format!("{}T00:00:00Z", date.format("%Y-%m-%d")));
    }
    if let Ok(secs) = text.parse::<i64>() {
        return unix_to_rfc3339(secs);
    }
    None
}

/// Unix seconds as RFC 3339 UTC.
pub fn unix_to_rfc3339(secs: i64) -> Option<String> {
    chrono::DateTime::from_timestamp(secs, 0).map(|dt| dt.format("%Y-%m-%dT%H:%M:%SZ").to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_normalise_to_utc() {
        assert_eq!(normalize_date("2026-01-31").as_deref(), Some("2026-01-31T00:00:00Z"));
        assert_eq!(normalize_date("2026-01-31T12:00:00+02:00").as_deref(), Some("2026-01-31T10:00:00Z"));
        assert_eq!(normalize_date("0").as_deref(), Some("1970-01-01T00:00:00Z"));
        assert_eq!(normalize_date("yesterday"), None);
    }
}
