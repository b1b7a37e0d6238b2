//! Comparing a server's answer with a session step. Byte for byte, except the fields the
//! vectors take from their own device model (README of `tests/vectors`, "Session vectors")
//! where any real server has values of its own: there only what the protocol fixes is compared,
//! and the case's detail says so. Buffer handles and base addresses are already placeholders.

use ggml_rpc_tests::template::{self, Bindings};
use ggml_rpc_tests::vector::Step;

/// Compares `out` with `step.expect`; a relaxed comparison adds what it did not compare to
/// `notes`.
pub fn step(
    step: &Step,
    out: &[u8],
    bindings: &mut Bindings,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let exact = template::matches(&step.expect, out, bindings);
    if exact.is_ok() {
        return exact;
    }
    let relaxed = match step.command.as_str() {
        "HELLO" => hello,
        "GET_DEVICE_MEMORY" => device_memory,
        "GET_ALIGNMENT" => alignment,
        "GET_MAX_SIZE" => max_size,
        _ => return exact,
    };
    // These answers carry no placeholder: the template renders to the vector's bytes.
    let want = template::render(&step.expect, bindings)?;
    // The size field and the layout are the protocol's.
    if want.len() != out.len() || want.get(..8) != out.get(..8) {
        return exact;
    }
    let note =
        relaxed(&want[8..], &out[8..]).map_err(|why| format!("{why}; {}", exact.unwrap_err()))?;
    if !notes.contains(&note) {
        notes.push(note);
    }
    Ok(())
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0)
}

/// §5.1: major and minor must be the vector's; the patch (ignored by the handshake, §1.6),
/// byte 3 (flags) and the server's own transport caps (§10.2) are the server's.
fn hello(want: &[u8], got: &[u8]) -> Result<String, String> {
    if want[..2] != got[..2] {
        return Err(format!(
            "HELLO answered version {}.{}, expected {}.{}",
            got[0], got[1], want[0], want[1]
        ));
    }
    Ok(format!(
        "HELLO {}.{}.{} flags {:#04x}: patch, flags and caps are the server's",
        got[0], got[1], got[2], got[3]
    ))
}

/// §5.3: the numbers are the server's; free memory cannot exceed the total.
fn device_memory(_want: &[u8], got: &[u8]) -> Result<String, String> {
    let (free, total) = (u64_at(got, 0), u64_at(got, 8));
    if free > total {
        return Err(format!("GET_DEVICE_MEMORY: free {free} > total {total}"));
    }
    Ok(
        "GET_DEVICE_MEMORY: free/total are the server's (compared the layout, free <= total)"
            .into(),
    )
}

/// §5.4: the server's alignment, a power of two.
fn alignment(_want: &[u8], got: &[u8]) -> Result<String, String> {
    let value = u64_at(got, 0);
    if !value.is_power_of_two() {
        return Err(format!("GET_ALIGNMENT {value} is not a power of two"));
    }
    Ok(format!(
        "GET_ALIGNMENT: the server's {value} (a power of two)"
    ))
}

/// §5.5: the server's largest buffer, non-zero.
fn max_size(_want: &[u8], got: &[u8]) -> Result<String, String> {
    if u64_at(got, 0) == 0 {
        return Err("GET_MAX_SIZE answered 0".into());
    }
    Ok("GET_MAX_SIZE: the server's (non-zero)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step_of(command: &str, expect: &str) -> Step {
        Step {
            command: command.into(),
            send: String::new(),
            expect: expect.into(),
        }
    }

    #[test]
    fn server_dependent_fields_are_relaxed_and_said_so() {
        let mut bindings = Bindings::new();
        let mut notes = Vec::new();
        let memory = step_of(
            "GET_DEVICE_MEMORY",
            "100000000000000000000040000000000000004000000000",
        );
        let mut got = 16u64.to_le_bytes().to_vec();
        got.extend_from_slice(&5u64.to_le_bytes());
        got.extend_from_slice(&9u64.to_le_bytes());
        step(&memory, &got, &mut bindings, &mut notes).unwrap();
        assert_eq!(notes.len(), 1);
        // free > total is wrong whatever the server.
        got[8..16].copy_from_slice(&10u64.to_le_bytes());
        assert!(step(&memory, &got, &mut bindings, &mut notes).is_err());
        // The size field is the protocol's.
        got[0] = 17;
        assert!(step(&memory, &got, &mut bindings, &mut notes).is_err());
        // A major or minor other than the vector's is a difference.
        let hello = step_of(
            "HELLO",
            "1c0000000000000008000000000000000000000000000000000000000000000000000000",
        );
        let mut answer = hex_bytes("1c0000000000000008000180");
        answer.extend_from_slice(&[7; 24]);
        step(&hello, &answer, &mut bindings, &mut notes).unwrap();
        answer[8] = 7;
        assert!(step(&hello, &answer, &mut bindings, &mut notes).is_err());
        // Other commands are compared byte for byte.
        let count = step_of("DEVICE_COUNT", "040000000000000001000000");
        assert!(step(
            &count,
            &hex_bytes("040000000000000002000000"),
            &mut bindings,
            &mut notes
        )
        .is_err());
    }

    fn hex_bytes(text: &str) -> Vec<u8> {
        ggml_rpc_tests::hex::decode(text).unwrap()
    }
}
