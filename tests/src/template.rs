//! Hex templates of session vectors: hex with `{placeholders}` for values the server chooses.
//!
//! A placeholder stands for exactly 8 bytes, a little-endian u64:
//!
//! * `{name}` — the value bound to `name`;
//! * `{name+N}` / `{name-N}` — that value plus / minus the decimal `N` (wrapping is an error);
//! * `{_}` — any 8 bytes (only in expected responses).
//!
//! In an expected response, `{name}` whose name is not bound yet *captures* the 8 bytes found
//! there; once bound, a name must match. In bytes to send every name must be bound already.
//! Names are `[a-z][a-z0-9_]*`.

use std::collections::BTreeMap;

use crate::hex;

/// Values captured so far (`buffer0` → handle, ...).
pub type Bindings = BTreeMap<String, u64>;

/// One piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Literal bytes.
    Bytes(Vec<u8>),
    /// A named value plus a signed offset.
    Value {
        /// The name.
        name: String,
        /// Added to the bound value.
        offset: i64,
    },
    /// Any 8 bytes.
    Any,
}

/// Parses a template.
pub fn parse(template: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut rest = template;
    while !rest.is_empty() {
        let literal_end = rest.find('{').unwrap_or(rest.len());
        if literal_end > 0 {
            pieces.push(Piece::Bytes(hex::decode(&rest[..literal_end])?));
        }
        rest = &rest[literal_end..];
        if rest.is_empty() {
            break;
        }
        let close = rest.find('}').ok_or("unterminated placeholder")?;
        pieces.push(placeholder(&rest[1..close])?);
        rest = &rest[close + 1..];
    }
    Ok(pieces)
}

fn placeholder(body: &str) -> Result<Piece, String> {
    if body == "_" {
        return Ok(Piece::Any);
    }
    let split = body.find(['+', '-']).unwrap_or(body.len());
    let (name, offset) = body.split_at(split);
    let valid_name = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid_name {
        return Err(format!("bad placeholder name in {{{body}}}"));
    }
    let offset = match offset.as_bytes().first() {
        None => 0,
        Some(sign) => {
            let magnitude: i64 = offset[1..]
                .parse()
                .map_err(|_| format!("bad offset in {{{body}}}"))?;
            if *sign == b'-' {
                -magnitude
            } else {
                magnitude
            }
        }
    };
    Ok(Piece::Value {
        name: name.to_owned(),
        offset,
    })
}

fn apply(base: u64, offset: i64, name: &str) -> Result<u64, String> {
    base.checked_add_signed(offset)
        .ok_or_else(|| format!("{{{name}{offset:+}}} wraps around (value {base:#x})"))
}

/// The number of bytes a template stands for.
pub fn byte_len(template: &str) -> Result<usize, String> {
    Ok(parse(template)?
        .iter()
        .map(|piece| match piece {
            Piece::Bytes(bytes) => bytes.len(),
            _ => 8,
        })
        .sum())
}

/// The bytes of a template whose names are all bound.
pub fn render(template: &str, bindings: &Bindings) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    for piece in parse(template)? {
        match piece {
            Piece::Bytes(bytes) => out.extend_from_slice(&bytes),
            Piece::Value { name, offset } => {
                let value = bindings
                    .get(&name)
                    .ok_or_else(|| format!("placeholder {{{name}}} used before it was captured"))?;
                out.extend_from_slice(&apply(*value, offset, &name)?.to_le_bytes());
            }
            Piece::Any => return Err("{_} may only appear in expected responses".into()),
        }
    }
    Ok(out)
}

/// Matches `actual` against a template, capturing unbound names (offset 0 only).
pub fn matches(template: &str, actual: &[u8], bindings: &mut Bindings) -> Result<(), String> {
    let mismatch = |at: usize, why: String| {
        format!(
            "byte {at}: {why} (expected {template}, got {})",
            hex::encode(actual)
        )
    };
    let mut at = 0usize;
    for piece in parse(template)? {
        let width = match &piece {
            Piece::Bytes(bytes) => bytes.len(),
            _ => 8,
        };
        let Some(got) = actual.get(at..at + width) else {
            return Err(mismatch(at, "output too short".into()));
        };
        match piece {
            Piece::Bytes(bytes) => {
                if got != bytes.as_slice() {
                    let first = got
                        .iter()
                        .zip(&bytes)
                        .position(|(a, b)| a != b)
                        .unwrap_or(0);
                    return Err(mismatch(at + first, "bytes differ".into()));
                }
            }
            Piece::Any => {}
            Piece::Value { name, offset } => {
                let value = u64::from_le_bytes(got.try_into().map_err(|_| "width")?);
                match bindings.get(&name) {
                    Some(&bound) => {
                        let want = apply(bound, offset, &name)?;
                        if value != want {
                            return Err(mismatch(
                                at,
                                format!("{{{name}}} is {want:#x}, got {value:#x}"),
                            ));
                        }
                    }
                    None if offset == 0 => {
                        bindings.insert(name, value);
                    }
                    None => return Err(format!("cannot capture {{{name}}} with an offset")),
                }
            }
        }
        at += width;
    }
    if at != actual.len() {
        return Err(mismatch(
            at,
            format!("{} unexpected trailing bytes", actual.len() - at),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_then_render() {
        let mut bindings = Bindings::new();
        let mut reply = vec![0x10, 0, 0, 0, 0, 0, 0, 0];
        reply.extend_from_slice(&0x1234u64.to_le_bytes());
        reply.extend_from_slice(&7u64.to_le_bytes());
        matches("1000000000000000{buffer0}{_}", &reply, &mut bindings).unwrap();
        assert_eq!(bindings["buffer0"], 0x1234);
        assert!(matches("1000000000000000{buffer0}{_}", &reply, &mut bindings).is_ok());
        let mut other = reply.clone();
        other[8] = 0x35;
        assert!(matches("1000000000000000{buffer0}{_}", &other, &mut bindings).is_err());
        assert!(matches("10000000000000", &reply, &mut bindings).is_err());
        assert_eq!(
            render("ab{buffer0+2}", &bindings).unwrap()[1..3],
            [0x36, 0x12]
        );
        assert_eq!(render("{buffer0-4}", &bindings).unwrap()[..2], [0x30, 0x12]);
        assert!(render("{base0}", &bindings).is_err());
        assert!(render("{_}", &bindings).is_err());
        assert!(parse("{Bad}").is_err());
        assert!(parse("{x+y}").is_err());
        assert!(parse("{x").is_err());
        assert_eq!(byte_len("00{a}{_}ff").unwrap(), 18);
    }
}
