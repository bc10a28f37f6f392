//! The report's JSON, written with serde_json: helpers for the values it is made of.

use serde_json::{Map, Value};

/// An object from (key, value) pairs.
pub fn obj<K: Into<String>>(pairs: impl IntoIterator<Item = (K, Value)>) -> Value {
    Value::Object(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect::<Map<_, _>>())
}

/// A string.
pub fn text(s: impl Into<String>) -> Value {
    Value::String(s.into())
}

/// A measurement: whole numbers as integers, others to three decimals (more than any of these
/// measurements resolve), null when not finite (JSON has no NaN or infinity).
pub fn num(x: f64) -> Value {
    if !x.is_finite() {
        Value::Null
    } else if x == x.trunc() && x.abs() < 1e15 {
        Value::from(x as i64)
    } else {
        Value::from((x * 1000.0).round() / 1000.0)
    }
}

/// [`num`], or null.
pub fn opt_num(x: Option<f64>) -> Value {
    x.map_or(Value::Null, num)
}

/// Two-space indented text, ending with a newline.
pub fn pretty(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).expect("a Value always serializes");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_nested_values_with_escapes() {
        let v = obj([
            ("a", Value::from(1)),
            ("b", text("x\"y\\z\n\u{1}")),
            ("c", Value::Array(vec![num(1.5), Value::Null, Value::Bool(true)])),
            ("d", obj::<String>([])),
            ("e", num(f64::NAN)),
        ]);
        assert_eq!(
            pretty(&v),
            "{\n  \"a\": 1,\n  \"b\": \"x\\\"y\\\\z\\n\\u0001\",\n  \"c\": [\n    1.5,\n    null,\n    true\n  ],\n  \"d\": {},\n  \"e\": null\n}\n"
        );
    }

    #[test]
    fn numbers_are_rounded_to_three_decimals() {
        assert_eq!(pretty(&num(1.23456)), "1.235\n");
        assert_eq!(pretty(&num(1240.0)), "1240\n");
    }
}
