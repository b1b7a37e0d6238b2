//! Sessions that break the tensor rules: records, types, shapes, regions of reads and writes.

use super::*;

pub(super) fn tensor_rules(version: ProtocolVersion, out: &mut Vec<Vector>) {
    let new = |name: &str, section: &str, description: &str| {
        Session::new(name, version, section, description)
    };
    let t = t32(1, [16, 1, 1, 1], 0, 0);
    let fail = |name: &str, section: &str, description: &str, request: Request, rule: &str| {
        new(name, section, description)
            .with_buffer(4096)
            .fail(&request, rule)
    };
    // Regions against the buffer.
    let end = t32(2, [4, 1, 1, 1], 0, 4080);
    out.push(fail("set_tensor_empty_at_buffer_end", "§5.10 step 3",
        "SET_TENSOR of 0 bytes at the very end of the buffer (inside the tensor's bounds): the start must be strictly inside the buffer",
        set(&end, 16, &[]), "region_inside_buffer"));
    out.push(fail(
        "get_tensor_empty_at_buffer_end",
        "§5.12",
        "GET_TENSOR of 0 bytes at the very end of the buffer",
        get(&end, 16, 0),
        "region_inside_buffer",
    ));
    out.push(fail(
        "get_tensor_huge_size",
        "§5.12, G10",
        "GET_TENSOR of 2^62 bytes: refused before anything is allocated",
        get(&t, 0, 1 << 62),
        "region_inside_buffer",
    ));
    let mut empty_past = t32(3, [0, 1, 1, 1], 0, 4097);
    empty_past.nb = [4, 4, 4, 4];
    out.push(fail("memset_tensor_empty_tensor_past_buffer", "§5.15",
        "MEMSET_TENSOR of 0 bytes of an empty tensor (exempt from the tensor-in-buffer check) placed 1 byte past the end of its buffer",
        Request::MemsetTensor { tensor: Box::new(empty_past.clone()), offset: 0, size: 0, value: 0 }, "region_inside_buffer"));
    out.push(fail(
        "set_tensor_empty_tensor_past_buffer",
        "§5.10 step 3",
        "SET_TENSOR of 0 bytes into an empty tensor placed 1 byte past the end of its buffer",
        set(&empty_past, 0, &[]),
        "region_inside_buffer",
    ));
    // Regions against the tensor (G4).
    let big = new("set_tensor_past_tensor_end", "G4, §5.10 step 5", "SET_TENSOR of 8 bytes at offset 60 of a 64-byte tensor (inside the buffer, outside the tensor)")
        .with_buffer(4096);
    out.push(big.fail(&set(&t, 60, &pattern(8, 2)), "region_inside_tensor"));
    out.push(fail(
        "get_tensor_past_tensor_end",
        "G4, §5.12",
        "GET_TENSOR of 16 bytes at offset 56 of a 64-byte tensor",
        get(&t, 56, 16),
        "region_inside_tensor",
    ));
    out.push(fail(
        "memset_tensor_past_tensor_end",
        "§5.15",
        "MEMSET_TENSOR of 1 byte at offset 64 of a 64-byte tensor",
        Request::MemsetTensor {
            tensor: Box::new(t.clone()),
            offset: 64,
            size: 1,
            value: 0,
        },
        "region_inside_tensor",
    ));
    // Types and shapes.
    let typed = |type_id: u32| {
        let mut tensor = t.clone();
        tensor.type_id = type_id;
        tensor
    };
    out.push(fail(
        "get_tensor_removed_type",
        "§3.3 step 1, §12.1",
        "GET_TENSOR of a tensor of type 4 (removed q4_2)",
        get(&typed(4), 0, 4),
        "type_id",
    ));
    out.push(fail(
        "set_tensor_type_43",
        "§3.3 step 1, §12.1",
        "SET_TENSOR into a tensor of type 43 (GGML_TYPE_COUNT)",
        set(&typed(43), 0, &[0; 4]),
        "type_id",
    ));
    out.push(fail(
        "init_tensor_type_max",
        "§3.3 step 1",
        "INIT_TENSOR of a tensor of type 2^32 - 1",
        Request::InitTensor {
            tensor: Box::new(typed(u32::MAX)),
        },
        "type_id",
    ));
    out.push(fail(
        "get_alloc_size_removed_type",
        "§3.3 step 1, §5.13",
        "GET_ALLOC_SIZE of a tensor of type 31 (removed q4_0_4_4)",
        Request::GetAllocSize(Box::new(AllocSizeRequest {
            device: 0,
            tensor: typed(31),
            srcs: Default::default(),
        })),
        "type_id",
    ));
    let mut q8 = stored(
        client_id(3),
        ty::Q8_0,
        [64, 1, 1, 1],
        buffer(0),
        base(0, 0),
        "q",
    );
    q8.ne[0] = 33;
    out.push(fail(
        "get_tensor_ne0_not_block_multiple",
        "G3, §12.1",
        "GET_TENSOR of a q8_0 tensor with ne[0] = 33 (block size 32)",
        get(&q8, 0, 4),
        "block_multiple",
    ));
    let mut q4k = stored(client_id(4), ty::Q4_K, [256, 1, 1, 1], 0, 0, "q");
    q4k.ne[0] = 100;
    out.push(fail(
        "get_alloc_size_ne0_not_block_multiple",
        "G3, §5.13",
        "GET_ALLOC_SIZE of a q4_K tensor with ne[0] = 100 (block size 256)",
        Request::GetAllocSize(Box::new(AllocSizeRequest {
            device: 0,
            tensor: q4k,
            srcs: Default::default(),
        })),
        "block_multiple",
    ));
    let mut huge = t.clone();
    huge.ne = [65536, 65536, 65536, 32768];
    out.push(fail(
        "get_tensor_element_count_2_63",
        "§3.3 step 2, G3",
        "GET_TENSOR of a tensor of 2^63 elements (one more than i64 holds)",
        get(&huge, 0, 4),
        "element_count",
    ));
    let mut max = t.clone();
    max.ne = [u32::MAX; 4];
    out.push(fail(
        "init_tensor_element_count_overflow",
        "§3.3 step 2, G3",
        "INIT_TENSOR of a tensor whose element count overflows 64 bits",
        Request::InitTensor {
            tensor: Box::new(max),
        },
        "element_count",
    ));
    let mut wide = t.clone();
    wide.ne = [u32::MAX, (1 << 31) - 1, 1, 1];
    wide.nb = [u32::MAX, u32::MAX, u32::MAX, u32::MAX];
    out.push(fail("get_tensor_byte_size_overflow", "§3.4, G5", "GET_TENSOR of a tensor whose element count fits i64 but whose byte extent overflows 64 bits",
        get(&wide, 0, 4), "address_arithmetic"));
    out.push(fail(
        "set_tensor_offset_wraps",
        "G5, §5.10 step 3",
        "SET_TENSOR at offset 2^64 - 1: data + offset wraps",
        set(&t, u64::MAX, &[1]),
        "address_arithmetic",
    ));
    out.push(fail(
        "get_tensor_offset_wraps",
        "G5, §5.12",
        "GET_TENSOR at offset 2^64 - 8: data + offset wraps",
        get(&t, u64::MAX - 7, 4),
        "address_arithmetic",
    ));
    // A streamed write longer than anything.
    let mut frame = request_frame(version, &set(&t, 0, &[]));
    frame[1..9].copy_from_slice(&(1u64 << 62).to_le_bytes());
    out.push(new("set_tensor_huge_length", "G10, §5.10", "A SET_TENSOR header declaring 2^62 bytes: refused after the 305-byte fixed part, before any data")
        .with_buffer(4096)
        .fail_bytes(&frame, false, "streamed_length"));
}
