//! The `fields` of a vector: typed requests and responses mapped to JSON by hand.
//!
//! The mapping is written against the field names of PROTOCOL.md, not derived from the byte
//! layout, so that comparing it with a vector's `fields` is an independent check of the decoder.
//! It is injective: two different messages never map to the same JSON, so a corrupted vector
//! cannot decode to its own `fields`.
//!
//! Conventions: u8, u32 and i32 values are JSON numbers; u64 values are JSON strings holding the
//! decimal value (as in the protobuf JSON mapping, so that no JSON reader loses precision);
//! byte strings are lowercase hex strings.

use proto_core::wire::{Command, Dialect, Request, Response, RpcTensor};
use serde_json::{json, Map, Value};

use crate::hex;

/// The protocol name of a command (`"GET_TENSOR"`).
pub fn command_name(command: Command) -> &'static str {
    match command {
        Command::AllocBuffer => "ALLOC_BUFFER",
        Command::GetAlignment => "GET_ALIGNMENT",
        Command::GetMaxSize => "GET_MAX_SIZE",
        Command::BufferGetBase => "BUFFER_GET_BASE",
        Command::FreeBuffer => "FREE_BUFFER",
        Command::BufferClear => "BUFFER_CLEAR",
        Command::SetTensor => "SET_TENSOR",
        Command::SetTensorHash => "SET_TENSOR_HASH",
        Command::GetTensor => "GET_TENSOR",
        Command::CopyTensor => "COPY_TENSOR",
        Command::GraphCompute => "GRAPH_COMPUTE",
        Command::GetDeviceMemory => "GET_DEVICE_MEMORY",
        Command::InitTensor => "INIT_TENSOR",
        Command::GetAllocSize => "GET_ALLOC_SIZE",
        Command::Hello => "HELLO",
        Command::DeviceCount => "DEVICE_COUNT",
        Command::GraphRecompute => "GRAPH_RECOMPUTE",
        Command::MemsetTensor => "MEMSET_TENSOR",
        Command::SetTensor2d => "SET_TENSOR_2D",
        Command::GetTensor2d => "GET_TENSOR_2D",
        Command::CommInit => "COMM_INIT",
        Command::CommAllreduce => "COMM_ALLREDUCE",
        Command::CommFree => "COMM_FREE",
        Command::Extensions => "EXTENSIONS",
        Command::RemoteCopyExpect => "REMOTE_COPY_EXPECT",
        Command::RemoteCopyAttach => "REMOTE_COPY_ATTACH",
        Command::RemoteCopyTensor => "REMOTE_COPY_TENSOR",
    }
}

/// The command with this protocol name.
pub fn command_by_name(name: &str) -> Option<Command> {
    Command::ALL
        .into_iter()
        .chain(Command::EXTENSIONS)
        .find(|&command| command_name(command) == name)
}

/// A u64 as a JSON string of its decimal value.
pub fn u64_value(value: u64) -> Value {
    Value::String(value.to_string())
}

fn u64_list(values: &[u64]) -> Value {
    Value::Array(values.iter().map(|&v| u64_value(v)).collect())
}

/// A fixed-size text field (tensor name, COMM_INIT host): `key` holds the bytes up to the first
/// NUL as a string; when that does not describe the field completely (bytes after the NUL, or
/// not UTF-8), `key_raw` additionally holds every byte as hex.
fn text_field(out: &mut Map<String, Value>, key: &str, bytes: &[u8]) {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let (text, rest) = bytes.split_at(end);
    let canonical = match std::str::from_utf8(text) {
        Ok(text) => {
            out.insert(key.to_owned(), Value::String(text.to_owned()));
            rest.iter().all(|&b| b == 0)
        }
        Err(_) => {
            out.insert(
                key.to_owned(),
                Value::String(String::from_utf8_lossy(text).into_owned()),
            );
            false
        }
    };
    if !canonical {
        out.insert(format!("{key}_raw"), Value::String(hex::encode(bytes)));
    }
}

/// One `rpc_tensor` record (PROTOCOL.md §3.1).
pub fn tensor(t: &RpcTensor) -> Value {
    let mut out = Map::new();
    out.insert("id".into(), u64_value(t.id));
    out.insert("type".into(), json!(t.type_id));
    out.insert("buffer".into(), u64_value(t.buffer));
    out.insert("ne".into(), json!(t.ne));
    out.insert("nb".into(), json!(t.nb));
    out.insert("op".into(), json!(t.op));
    out.insert("op_params".into(), json!(t.op_params));
    out.insert("flags".into(), json!(t.flags));
    out.insert("src".into(), u64_list(&t.src));
    out.insert("view_src".into(), u64_value(t.view_src));
    out.insert("view_offs".into(), u64_value(t.view_offs));
    out.insert("data".into(), u64_value(t.data));
    text_field(&mut out, "name", &t.name);
    out.insert("use_count".into(), json!(t.use_count));
    Value::Object(out)
}

/// A record that may be absent: 296 zero bytes map to `null` (GET_ALLOC_SIZE sources).
pub fn optional_tensor(t: &RpcTensor) -> Value {
    if *t == RpcTensor::default() {
        Value::Null
    } else {
        tensor(t)
    }
}

/// The fields of a request payload (the frame header is implied by the vector's `command` and
/// `hex`). GRAPH_COMPUTE and GRAPH_RECOMPUTE have `uid` only in protocol 8.
pub fn request(request: &Request, dialect: Dialect) -> Value {
    let v8 = dialect == Dialect::V8;
    match request {
        Request::Hello { caps } => json!({ "conn_caps": hex::encode(caps) }),
        Request::DeviceCount => json!({}),
        Request::AllocBuffer { device, size } => {
            json!({ "device": device, "size": u64_value(*size) })
        }
        Request::GetAlignment { device }
        | Request::GetMaxSize { device }
        | Request::GetDeviceMemory { device }
        | Request::CommFree { device } => json!({ "device": device }),
        Request::BufferGetBase { buffer } | Request::FreeBuffer { buffer } => {
            json!({ "remote_ptr": u64_value(*buffer) })
        }
        Request::BufferClear { buffer, value } => {
            json!({ "remote_ptr": u64_value(*buffer), "value": value })
        }
        Request::SetTensor { header, data } => json!({
            "tensor": tensor(&header.tensor),
            "cache_flag": header.cache_flag,
            "offset": u64_value(header.offset),
            "data": hex::encode(data),
        }),
        Request::SetTensorHash {
            tensor: t,
            offset,
            hash,
        } => json!({
            "tensor": tensor(t),
            "offset": u64_value(*offset),
            "hash": u64_value(*hash),
        }),
        Request::GetTensor {
            tensor: t,
            offset,
            size,
        } => json!({
            "tensor": tensor(t),
            "offset": u64_value(*offset),
            "size": u64_value(*size),
        }),
        Request::CopyTensor { src, dst } => json!({ "src": tensor(src), "dst": tensor(dst) }),
        Request::GraphCompute(graph) => {
            let mut out = Map::new();
            out.insert("device".into(), json!(graph.device));
            if v8 {
                out.insert("uid".into(), u64_value(graph.uid));
            }
            out.insert("n_nodes".into(), json!(graph.node_ids.len()));
            out.insert("node_ids".into(), u64_list(&graph.node_ids));
            out.insert("n_tensors".into(), json!(graph.tensors.len()));
            out.insert("tensors".into(), graph.tensors.iter().map(tensor).collect());
            Value::Object(out)
        }
        Request::InitTensor { tensor: t } => json!({ "tensor": tensor(t) }),
        Request::GetAllocSize(req) => json!({
            "device": req.device,
            "tensor": tensor(&req.tensor),
            "srcs": req.srcs.iter().map(optional_tensor).collect::<Vec<_>>(),
        }),
        Request::GraphRecompute { device, uid } => {
            if v8 {
                json!({ "device": device, "uid": u64_value(*uid) })
            } else {
                json!({ "device": device })
            }
        }
        Request::MemsetTensor {
            tensor: t,
            offset,
            size,
            value,
        } => json!({
            "tensor": tensor(t),
            "offset": u64_value(*offset),
            "size": u64_value(*size),
            "value": value,
        }),
        Request::SetTensor2d { header, data } => {
            let mut out = tensor_2d(header);
            out.insert("data".into(), Value::String(hex::encode(data)));
            Value::Object(out)
        }
        Request::GetTensor2d(header) => Value::Object(tensor_2d(header)),
        Request::CommInit(req) => {
            let mut out = Map::new();
            out.insert("device".into(), json!(req.device));
            out.insert("rank".into(), json!(req.rank));
            out.insert("world".into(), json!(req.world));
            out.insert("port".into(), json!(req.port));
            text_field(&mut out, "host", &req.host);
            Value::Object(out)
        }
        Request::CommAllreduce { device, tensor: t } => {
            json!({ "device": device, "tensor": tensor(t) })
        }
        Request::Extensions { wanted } => json!({ "wanted": u64_value(*wanted) }),
        Request::RemoteCopyExpect(header) => Value::Object(tensor_2d(header)),
        Request::RemoteCopyAttach {
            ticket,
            buffer,
            start,
            size,
            n_copies,
            stride,
        } => json!({
            "ticket": u64_value(*ticket),
            "remote_ptr": u64_value(*buffer),
            "start": u64_value(*start),
            "size": u64_value(*size),
            "n_copies": u64_value(*n_copies),
            "stride": u64_value(*stride),
        }),
        Request::RemoteCopyTensor(req) => {
            let mut out = Map::new();
            out.insert("src".into(), tensor(&req.src));
            out.insert("src_offset".into(), u64_value(req.src_offset));
            out.insert("size".into(), u64_value(req.size));
            out.insert("n_copies".into(), u64_value(req.n_copies));
            out.insert("src_stride".into(), u64_value(req.src_stride));
            out.insert("dst".into(), tensor(&req.dst));
            out.insert("dst_offset".into(), u64_value(req.dst_offset));
            out.insert("dst_stride".into(), u64_value(req.dst_stride));
            out.insert("ticket".into(), u64_value(req.ticket));
            text_field(&mut out, "endpoint", &req.endpoint);
            Value::Object(out)
        }
    }
}

fn tensor_2d(header: &proto_core::wire::Tensor2dHeader) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("tensor".into(), tensor(&header.tensor));
    out.insert("offset".into(), u64_value(header.offset));
    out.insert("size".into(), u64_value(header.size));
    out.insert("n_copies".into(), u64_value(header.n_copies));
    out.insert("stride".into(), u64_value(header.stride));
    out
}

/// The fields of a response payload.
pub fn response(response: &Response) -> Value {
    match response {
        Response::Hello {
            version,
            flags,
            caps,
        } => json!({
            "major": version.major,
            "minor": version.minor,
            "patch": version.patch,
            "flags": flags,
            "conn_caps": hex::encode(caps),
        }),
        Response::DeviceCount(count) => json!({ "device_count": count }),
        Response::AllocBuffer {
            remote_ptr,
            remote_size,
        } => json!({
            "remote_ptr": u64_value(*remote_ptr),
            "remote_size": u64_value(*remote_size),
        }),
        Response::Alignment(v) => json!({ "alignment": u64_value(*v) }),
        Response::MaxSize(v) => json!({ "max_size": u64_value(*v) }),
        Response::BufferBase(v) => json!({ "base_ptr": u64_value(*v) }),
        Response::SetTensorHash(v) | Response::CopyTensor(v) => json!({ "result": v }),
        Response::TensorData(data) | Response::Tensor2dData(data) => {
            json!({ "data": hex::encode(data) })
        }
        Response::DeviceMemory { free, total } => json!({
            "free_mem": u64_value(*free),
            "total_mem": u64_value(*total),
        }),
        Response::AllocSize(v) => json!({ "alloc_size": u64_value(*v) }),
        Response::CommInit(ok) => json!({ "ok": ok }),
        Response::Extensions(granted) => json!({ "granted": u64_value(*granted) }),
        Response::RemoteCopyExpect { status, ticket } => {
            json!({ "status": status, "ticket": u64_value(*ticket) })
        }
        Response::RemoteCopyAttach(status) | Response::RemoteCopyTensor(status) => {
            json!({ "status": status })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for command in Command::ALL.into_iter().chain(Command::EXTENSIONS) {
            assert_eq!(command_by_name(command_name(command)), Some(command));
        }
        assert_eq!(command_by_name("NONE"), None);
    }

    #[test]
    fn names_are_injective() {
        let mut a = RpcTensor::default();
        a.set_name("w");
        let mut b = a.clone();
        b.name[40] = 1;
        assert_ne!(tensor(&a), tensor(&b));
        assert!(tensor(&b).get("name_raw").is_some());
        assert!(tensor(&a).get("name_raw").is_none());
        assert_eq!(optional_tensor(&RpcTensor::default()), Value::Null);
    }
}
