//! The conformance table, its summary and the JSON form.

use std::fmt::Write as _;

use proto_core::wire::ProtocolVersion;

use super::socket::ServerFacts;
use super::{CaseResult, Outcome};

/// Widest detail in the table (the JSON has it whole).
const DETAIL_WIDTH: usize = 110;

/// The result column: the outcome, and the gap when it is a documented one.
pub fn result_text(result: &CaseResult) -> String {
    if result.known_gap.is_empty() {
        result.outcome.as_str().to_owned()
    } else {
        format!(
            "known gap {} ({})",
            result.known_gap.join(","),
            result.outcome.as_str()
        )
    }
}

fn shorten(text: &str) -> String {
    if text.chars().count() <= DETAIL_WIDTH {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(DETAIL_WIDTH - 1).collect();
    out.push('…');
    out
}

/// One table row (printed as each case ends).
pub fn row(result: &CaseResult) -> String {
    format!(
        "{:<58} {:<22} {:>7.3}s  {}\n",
        result.name,
        result_text(result),
        result.time.as_secs_f64(),
        shorten(&result.detail)
    )
}

/// The table's header.
pub fn header(endpoint: &str, version: ProtocolVersion, facts: &ServerFacts) -> String {
    let (major, minor, patch) = facts.version;
    format!(
        "conformance of {endpoint}: server {major}.{minor}.{patch}, {} device(s); checking {version}\n\
         {:<58} {:<22} {:>8}  detail\n",
        facts.devices, "case", "result", "time"
    )
}

/// Counts per result class and the verdict.
pub fn summary(results: &[CaseResult], strict: bool) -> String {
    let count = |outcome: Outcome, gap: bool| {
        results
            .iter()
            .filter(|r| r.outcome == outcome && r.known_gap.is_empty() != gap)
            .count()
    };
    let gaps = results.iter().filter(|r| !r.known_gap.is_empty()).count();
    let mut out = String::new();
    let _ = write!(
        out,
        "{} cases: {} passed, {} refused, {} died, {} hung, {} known gap, {} n/a",
        results.len(),
        count(Outcome::Passed, false),
        count(Outcome::Refused, false),
        count(Outcome::Died, false),
        count(Outcome::Hung, false),
        gaps,
        count(Outcome::Skipped, false),
    );
    let ok = results.iter().all(|r| r.acceptable(strict));
    let verdict = match (ok, strict) {
        (true, _) => "CONFORMANT",
        (false, true) => "NOT CONFORMANT (--strict: known gaps count)",
        (false, false) => "NOT CONFORMANT",
    };
    let _ = writeln!(out, "; {verdict}");
    out
}

/// The whole run as JSON.
pub fn json(
    endpoint: &str,
    version: ProtocolVersion,
    facts: &ServerFacts,
    results: &[CaseResult],
    strict: bool,
) -> serde_json::Value {
    let (major, minor, patch) = facts.version;
    let cases: Vec<_> = results
        .iter()
        .map(|r| {
            serde_json::json!({
                "case": r.name,
                "result": r.outcome.as_str(),
                "known_gap": r.known_gap,
                "detail": r.detail,
                "seconds": r.time.as_secs_f64(),
            })
        })
        .collect();
    serde_json::json!({
        "server": endpoint,
        "server_version": format!("{major}.{minor}.{patch}"),
        "devices": facts.devices,
        "checked_version": version.to_string(),
        "strict": strict,
        "conformant": results.iter().all(|r| r.acceptable(strict)),
        "cases": cases,
    })
}
