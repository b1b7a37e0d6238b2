//! Byte sizes on the command line (`256MiB`) and in tables.

/// Parses a byte size: a number with an optional unit. `K`, `M`, `G`, `T` alone or with `iB`
/// are binary (1024-based); `KB`, `MB`, `GB`, `TB` are decimal; `B` or no unit means bytes.
/// Case-insensitive except that the binary/decimal choice is made by the letters only.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("not a size: {text:?} (examples: 4096, 64KiB, 256MiB, 1GB)"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => return Err(format!("unknown size unit {other:?} in {text:?}")),
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("size too large: {text:?}"))
}

/// A byte count for humans: the largest binary unit that keeps at least 1, one decimal
/// unless exact (`256 MiB`, `1.5 GiB`, `100 B`).
pub fn format_bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, scale) in UNITS {
        if n >= scale {
            return if n.is_multiple_of(scale) {
                format!("{} {name}", n / scale)
            } else {
                format!("{:.1} {name}", n as f64 / scale as f64)
            };
        }
    }
    format!("{n} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("2 GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("64kib"), Ok(64 << 10));
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn bytes_format_compactly() {
        assert_eq!(format_bytes(100), "100 B");
        assert_eq!(format_bytes(256 << 20), "256 MiB");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
        assert_eq!(format_bytes(1 << 10), "1 KiB");
    }
}
