//! Which cases run against a server: the test vectors, generated in memory by the same code as
//! `tests/vectors/` (so the installed binary needs no checkout and nothing is copied), and
//! the hostile cases that are no vector.

use ggml_rpc_tests::generate;
use ggml_rpc_tests::hex;
use ggml_rpc_tests::hostile::{AbandonedSetTensor, ABANDONED_SET_TENSOR};
use ggml_rpc_tests::rules;
use ggml_rpc_tests::vector::{Direction, FinalStep, Level, ServerParams, Step, Vector};
use proto_core::wire::{Command, Dialect, ProtocolVersion, Request, HELLO_FLAG_EXTENSIONS};

use super::socket::ServerFacts;

/// The largest buffered request the vectors' server accepts by default (ours: the
/// `--max-message-size` default; llama.cpp's: no limit).
const DEFAULT_MAX_MESSAGE_SIZE: &str = "268435456";

/// What one case does.
#[derive(Debug, Clone)]
pub enum CaseKind {
    /// A session vector (an invalid frame vector is a session: HELLO, then the frame).
    Session(Box<Vector>),
    /// A client leaving in the middle of a large SET_TENSOR.
    Abandon(AbandonedSetTensor),
}

/// One case of the run.
#[derive(Debug, Clone)]
pub struct Case {
    /// Vector name, or `hostile/...`.
    pub name: String,
    /// What it does.
    pub kind: CaseKind,
    /// Why it is not run against this server, if it is not.
    pub skip: Option<String>,
    /// Reference gaps (PROTOCOL.md §13, `G<n>`) the case's rule is about.
    pub gaps: Vec<String>,
}

/// The cases for a server serving `version`, in vector-name order, filtered by `only`
/// (substring of the name).
pub fn cases(version: ProtocolVersion, facts: &ServerFacts, only: Option<&str>) -> Vec<Case> {
    let mut out: Vec<Case> = generate::all()
        .into_iter()
        .filter_map(|v| case_of(v, version, facts))
        .collect();
    out.push(Case {
        name: "hostile/abandoned_set_tensor".into(),
        kind: CaseKind::Abandon(ABANDONED_SET_TENSOR),
        skip: None,
        gaps: Vec::new(),
    });
    if let Some(pattern) = only {
        out.retain(|case| case.name.contains(pattern));
    }
    out
}

/// Whether a vector of `protocol` checks a server of `version`. 8.0.1 has 8.0.0's frames and
/// sessions, except where ggml's numbering moved (§1.4): type ids and graphs (whose op ids an
/// 8.0.1 server reads in its own numbering) are the 8.0.1 vectors'.
fn applies(v: &Vector, version: ProtocolVersion) -> bool {
    let served = version.to_string();
    if v.protocol == served {
        return true;
    }
    version == ProtocolVersion::V8_0_1
        && v.protocol == "8.0.0"
        && !v.name.contains("from_8_0_1")
        && !matches!(v.rule.as_deref(), Some("type_id" | "graph_op"))
        && !frames(v).any(|frame| frame.starts_with("0a"))
}

/// The hex (templates) of every frame a vector sends.
fn frames(v: &Vector) -> impl Iterator<Item = &str> {
    v.hex
        .as_deref()
        .into_iter()
        .chain(v.steps.iter().flatten().map(|step| step.send.as_str()))
        .chain(v.final_step.iter().map(|last| last.send.as_str()))
}

fn case_of(v: Vector, version: ProtocolVersion, facts: &ServerFacts) -> Option<Case> {
    if v.direction != Direction::ClientToServer || !applies(&v, version) {
        return None;
    }
    let v = match (v.level, v.valid) {
        (Level::Session, _) => v,
        // Valid frames need state the frame does not set up; sessions cover them.
        (Level::Frame, true) => return None,
        (Level::Frame, false) => frame_session(v, version)?,
    };
    let gaps = if v.valid {
        Vec::new()
    } else {
        gaps_of(&v, version)
    };
    Some(Case {
        name: v.name.clone(),
        skip: skip_reason(&v, facts),
        gaps,
        kind: CaseKind::Session(Box::new(v)),
    })
}

/// The server the vectors assume, as far as HELLO and DEVICE_COUNT show.
fn default_params() -> ServerParams {
    ServerParams {
        devices: 1,
        device_memory: "1073741824".into(),
        alignment: "32".into(),
        memory_quota: None,
        max_message_size: DEFAULT_MAX_MESSAGE_SIZE.into(),
        tensor_cache: false,
        conn_caps: "00".repeat(24),
    }
}

/// An invalid request frame as a session: HELLO first (unless the frame is a HELLO), then the
/// frame, which must close the connection.
fn frame_session(mut v: Vector, version: ProtocolVersion) -> Option<Vector> {
    let frame = v.hex.take()?;
    let mut steps = Vec::new();
    if !frame.starts_with("0e") {
        let hello = Request::Hello { caps: [0; 24] }
            .to_frame(Dialect::V8)
            .ok()?;
        steps.push(Step {
            command: "HELLO".into(),
            send: hex::encode(&hello),
            expect: format!(
                "1c00000000000000{:02x}{:02x}{:02x}00{}",
                version.major,
                version.minor,
                version.patch,
                "00".repeat(24)
            ),
        });
    }
    v.level = Level::Session;
    v.server = Some(default_params());
    v.steps = Some(steps);
    v.final_step = Some(FinalStep {
        command: v.command.clone(),
        send: frame,
        eof: false,
    });
    Some(v)
}

fn skip_reason(v: &Vector, facts: &ServerFacts) -> Option<String> {
    let params = v.server.as_ref()?;
    if params.devices != facts.devices {
        return Some(format!(
            "needs a server with {} device(s), this one has {}",
            params.devices, facts.devices
        ));
    }
    if let Some(quota) = &params.memory_quota {
        return Some(format!("needs a per-client memory quota of {quota} bytes"));
    }
    if params.max_message_size != DEFAULT_MAX_MESSAGE_SIZE {
        return Some(format!(
            "needs a server whose largest buffered request is {} bytes",
            params.max_message_size
        ));
    }
    if params.tensor_cache {
        return Some("needs a server with an empty tensor cache".into());
    }
    if sends_extension(v) && facts.hello_flags & HELLO_FLAG_EXTENSIONS == 0 {
        return Some(
            "our private extension (ids 0xF0-0xF3): the server does not offer it (HELLO flag \
             bit 7), so none is sent"
                .into(),
        );
    }
    None
}

/// Whether a frame of the session carries one of our private ids (0xF0-0xF3; 0xFF and the
/// like are plain unknown ids, sent to any server).
fn sends_extension(v: &Vector) -> bool {
    frames(v)
        .filter_map(|send| send.get(..2))
        .filter_map(|id| u8::from_str_radix(id, 16).ok())
        .any(|id| Command::extension(id).is_some())
}

/// The reference gaps (PROTOCOL.md §13) a vector is about, from its `spec` and its rule's,
/// less those §13 limits to the other major ("(7)", "(8)").
fn gaps_of(v: &Vector, version: ProtocolVersion) -> Vec<String> {
    let rule_spec = v
        .rule
        .as_deref()
        .and_then(rules::rule_by_slug)
        .map_or("", |rule| rule.spec);
    let mut out = gaps(&v.spec);
    for gap in gaps(rule_spec) {
        if !out.contains(&gap) {
            out.push(gap);
        }
    }
    out.retain(|gap| match gap.as_str() {
        "G2" | "G16" => version.major == 7,
        "G13" | "G14" | "G25" => version.major == 8,
        _ => true,
    });
    out
}

/// The `G<n>` names in a `spec` text.
fn gaps(spec: &str) -> Vec<String> {
    spec.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|word| {
            word.len() > 1 && word.starts_with('G') && word[1..].bytes().all(|b| b.is_ascii_digit())
        })
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(devices: u32, flags: u8) -> ServerFacts {
        ServerFacts {
            version: (8, 0, 0),
            hello_flags: flags,
            devices,
        }
    }

    #[test]
    fn a_plan_covers_sessions_invalid_frames_and_the_hostile_case() {
        let plan = cases(ProtocolVersion::V8_0_0, &facts(1, 0), None);
        let has = |name: &str| plan.iter().any(|c| c.name == name);
        assert!(has("sessions/v8/hello_caps"));
        assert!(has("invalid/session/v8/graph_cycle"));
        assert!(has("invalid/frame/v8/unknown_command_23"));
        assert!(has("hostile/abandoned_set_tensor"));
        assert!(!has("sessions/v7/lifecycle"));
        assert!(!plan.iter().any(|c| c.name.contains("/responses/")));
        let find = |name: &str| plan.iter().find(|c| c.name == name).unwrap();
        // 2 devices needed, 1 there.
        assert!(find("sessions/v8/lifecycle").skip.is_some());
        // No extension id goes to a server that does not offer them.
        assert!(find("invalid/session/v8/remote_copy_without_extensions")
            .skip
            .is_some());
        let ours = cases(
            ProtocolVersion::V8_0_0,
            &facts(1, HELLO_FLAG_EXTENSIONS),
            None,
        );
        let offered = ours
            .iter()
            .find(|c| c.name == "invalid/session/v8/remote_copy_without_extensions")
            .unwrap();
        assert!(offered.skip.is_none());
        // 0xFF is no extension id: every server gets it.
        assert!(find("invalid/frame/v8/unknown_command_255").skip.is_none());
        assert_eq!(
            find("invalid/session/v8/get_tensor_past_tensor_end").gaps,
            ["G4"]
        );
        // `--only` filters by name.
        let only = cases(ProtocolVersion::V7_0_0, &facts(1, 0), Some("second_hello"));
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].name, "invalid/session/v7/second_hello");
    }

    #[test]
    fn an_8_0_1_server_gets_8_0_0_cases_whose_numbering_did_not_move() {
        let plan = cases(ProtocolVersion::V8_0_1, &facts(1, 0), None);
        let has = |name: &str| plan.iter().any(|c| c.name == name);
        assert!(has("sessions/v8.0.1/moved_ops"));
        assert!(!has("invalid/session/v8/graph_op_101"));
        assert!(!has("invalid/session/v8/set_tensor_type_43"));
        assert!(!has("invalid/session/v8/graph_cycle"));
        assert!(has("invalid/session/v8/second_hello"));
    }
}
