//! Small text helpers with no feature behind them: durations in words, hex, JSON sizes.

use std::time::Duration;

/// "1 second", "30 seconds", "2.5 seconds": how limits read in messages.
pub fn seconds(d: &Duration) -> String {
    let secs = d.as_secs_f64();
    if secs == 1.0 {
        "1 second".to_string()
    } else if secs.fract() == 0.0 {
        format!("{} seconds", secs as u64)
    } else {
        format!("{secs:.1} seconds")
    }
}

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The length of `value` as compact JSON, counted without building the text.
pub fn json_size(value: &(impl serde::Serialize + ?Sized)) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// How a JSON value's type is named in messages: "a string", "an object", "null".
pub fn kind(value: &serde_json::Value) -> &'static str {
    use serde_json::Value as Json;
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}
