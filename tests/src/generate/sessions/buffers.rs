//! Sessions that break the buffer rules: handles, sizes, quotas, regions.

use super::*;

pub(super) fn buffer_rules(version: ProtocolVersion, out: &mut Vec<Vector>) {
    let new = |name: &str, section: &str, description: &str| {
        Session::new(name, version, section, description)
    };
    let unknown = 0x0000_5581_2e4a_b000u64;
    out.push(
        new(
            "buffer_get_base_unknown",
            "§5.7",
            "BUFFER_GET_BASE of a handle on a connection that allocated nothing",
        )
        .hello()
        .fail(&Request::BufferGetBase { buffer: unknown }, "buffer_handle"),
    );
    out.push(
        new(
            "buffer_get_base_zero",
            "§5.7",
            "BUFFER_GET_BASE of handle 0 (the failed-allocation handle)",
        )
        .hello()
        .fail(&Request::BufferGetBase { buffer: 0 }, "buffer_handle"),
    );
    let mut s = new(
        "free_buffer_twice",
        "§5.8",
        "FREE_BUFFER of a handle already freed",
    )
    .with_buffer(4096);
    s.cast(&Request::FreeBuffer { buffer: buffer(0) });
    out.push(s.fail(&Request::FreeBuffer { buffer: buffer(0) }, "buffer_handle"));
    out.push(
        new("free_buffer_zero", "§5.8", "FREE_BUFFER of handle 0")
            .with_buffer(4096)
            .fail(&Request::FreeBuffer { buffer: 0 }, "buffer_handle"),
    );
    let mut s = new(
        "buffer_clear_freed",
        "§5.9",
        "BUFFER_CLEAR of a freed buffer",
    )
    .with_buffer(4096);
    s.cast(&Request::FreeBuffer { buffer: buffer(0) });
    out.push(s.fail(
        &Request::BufferClear {
            buffer: buffer(0),
            value: 0,
        },
        "buffer_handle",
    ));
    let t = t32(1, [16, 1, 1, 1], 0, 0);
    let freed = |name: &str, description: &str, request: Request| {
        let mut s = new(name, "§3.3 step 4, G1", description).with_buffer(4096);
        s.cast(&Request::FreeBuffer { buffer: buffer(0) });
        s.fail(&request, "buffer_handle")
    };
    out.push(freed(
        "get_tensor_freed_buffer",
        "GET_TENSOR of a tensor whose buffer was freed",
        get(&t, 0, 4),
    ));
    out.push(freed(
        "set_tensor_freed_buffer",
        "SET_TENSOR into a tensor whose buffer was freed",
        set(&t, 0, &[1, 2, 3, 4]),
    ));
    out.push(freed(
        "memset_tensor_freed_buffer",
        "MEMSET_TENSOR of a tensor whose buffer was freed",
        Request::MemsetTensor {
            tensor: Box::new(t.clone()),
            offset: 0,
            size: 4,
            value: 0,
        },
    ));
    out.push(new("init_tensor_unknown_buffer", "§5.14, G18", "INIT_TENSOR naming a handle this connection never allocated (the reference logs and succeeds; rejected)")
        .with_buffer(4096)
        .fail(&Request::InitTensor { tensor: Box::new(f32_at(client_id(1), [16, 1, 1, 1], unknown, 0x0000_7f1c_2000_0000, "t")) }, "buffer_handle"));
    let mut s = new(
        "copy_tensor_freed_destination",
        "§5.16",
        "COPY_TENSOR into a tensor of a freed buffer",
    )
    .with_buffer(4096);
    s.alloc(1, 0, 4096);
    s.cast(&Request::FreeBuffer { buffer: buffer(1) });
    out.push(s.fail(
        &Request::CopyTensor {
            src: Box::new(t.clone()),
            dst: Box::new(t32(2, [16, 1, 1, 1], 1, 0)),
        },
        "buffer_handle",
    ));

    let mut host = t.clone();
    host.buffer = 0;
    host.data = 0;
    let missing = |name: &str, section: &str, description: &str, request: Request| {
        new(name, section, description)
            .with_buffer(4096)
            .fail(&request, "tensor_needs_buffer")
    };
    out.push(missing(
        "set_tensor_no_buffer",
        "§5.10 step 2",
        "SET_TENSOR into a tensor with buffer 0",
        set(&host, 0, &[1, 2, 3, 4]),
    ));
    out.push(missing(
        "get_tensor_no_buffer",
        "§5.12",
        "GET_TENSOR of a tensor with buffer 0",
        get(&host, 0, 4),
    ));
    out.push(missing(
        "memset_tensor_no_buffer",
        "§5.15",
        "MEMSET_TENSOR of a tensor with buffer 0",
        Request::MemsetTensor {
            tensor: Box::new(host.clone()),
            offset: 0,
            size: 4,
            value: 0,
        },
    ));
    out.push(missing(
        "copy_tensor_source_no_buffer",
        "§5.16",
        "COPY_TENSOR from a tensor with buffer 0",
        Request::CopyTensor {
            src: Box::new(host.clone()),
            dst: Box::new(t.clone()),
        },
    ));
    out.push(missing(
        "init_tensor_no_buffer",
        "§5.14, G18",
        "INIT_TENSOR of a tensor with buffer 0 (the reference logs and succeeds; rejected)",
        Request::InitTensor {
            tensor: Box::new(host.clone()),
        },
    ));

    let outside = |name: &str,
                   section: &str,
                   description: &str,
                   tensor: RpcTensor,
                   request: fn(&RpcTensor) -> Request| {
        new(name, section, description)
            .with_buffer(4096)
            .fail(&request(&tensor), "tensor_inside_buffer")
    };
    out.push(outside(
        "get_tensor_crosses_buffer_end",
        "§3.3 step 5",
        "GET_TENSOR of a 64-byte tensor starting 32 bytes before the end of its 4096-byte buffer",
        t32(1, [16, 1, 1, 1], 0, 4064),
        |t| get(t, 0, 4),
    ));
    out.push(outside(
        "get_tensor_before_buffer",
        "§3.3 step 5",
        "GET_TENSOR of a tensor starting 16 bytes before its buffer's base",
        t32(1, [16, 1, 1, 1], 0, -16),
        |t| get(t, 32, 4),
    ));
    out.push(outside(
        "set_tensor_data_zero",
        "§3.3 step 5",
        "SET_TENSOR into a tensor of a known buffer whose data address is 0",
        f32_at(client_id(1), [16, 1, 1, 1], buffer(0), 0, "t"),
        |t| set(t, 0, &[1, 2, 3, 4]),
    ));
    out.push(outside(
        "init_tensor_outside_buffer",
        "§3.3 step 5, §5.14",
        "INIT_TENSOR of a tensor that extends past its buffer",
        t32(1, [1024, 2, 1, 1], 0, 0),
        |t| Request::InitTensor {
            tensor: Box::new(t.clone()),
        },
    ));
    out.push(outside(
        "copy_tensor_source_outside_buffer",
        "§3.3 step 5, §5.16",
        "COPY_TENSOR from a tensor that extends past its buffer",
        t32(1, [16, 1, 1, 1], 0, 4090),
        |t| Request::CopyTensor {
            src: Box::new(t.clone()),
            dst: Box::new(t32(2, [16, 1, 1, 1], 0, 0)),
        },
    ));
    out.push(outside("get_alloc_size_outside_buffer", "§3.3 step 5, §5.13",
        "GET_ALLOC_SIZE of a tensor that names a known buffer but extends past it: deserialization fails, the connection closes",
        t32(1, [16, 1, 1, 1], 0, 4090),
        |t| Request::GetAllocSize(Box::new(AllocSizeRequest { device: 0, tensor: t.clone(), srcs: Default::default() }))));
    let mut s = new(
        "tensor_in_zero_size_buffer",
        "§3.3 step 5, §4.3",
        "GET_TENSOR of a 64-byte tensor in a zero-size buffer (base 0)",
    )
    .hello();
    s.alloc(0, 0, 0);
    out.push(s.fail(
        &get(
            &f32_at(client_id(1), [16, 1, 1, 1], buffer(0), 0, "t"),
            0,
            4,
        ),
        "tensor_inside_buffer",
    ));

    let mut copy = new(
        "copy_tensor_larger_source",
        "§5.16, G19",
        "COPY_TENSOR of a 64-byte tensor into a 32-byte tensor, both inside one buffer",
    )
    .with_buffer(4096);
    copy.cast(&set(&t, 0, &pattern(64, 1)));
    out.push(copy.fail(
        &Request::CopyTensor {
            src: Box::new(t.clone()),
            dst: Box::new(t32(2, [8, 1, 1, 1], 0, 1024)),
        },
        "copy_destination",
    ));
    out.push(new("copy_tensor_past_buffer_end", "§5.16", "COPY_TENSOR of a 128-byte tensor into a 64-byte tensor at the end of the buffer: the write would leave the buffer")
        .with_buffer(4096)
        .fail(&Request::CopyTensor { src: Box::new(t32(1, [32, 1, 1, 1], 0, 0)), dst: Box::new(t32(2, [16, 1, 1, 1], 0, 4032)) }, "copy_destination"));
}
