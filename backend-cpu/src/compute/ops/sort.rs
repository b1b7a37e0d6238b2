//! GCC's `std::sort` (introsort) and `std::partial_sort` (heap select), step for step, over a
//! slice of indices.
//!
//! ggml-cpu's ARGSORT is `std::sort` and its TOP_K `std::partial_sort`, neither stable: where
//! values tie, which index comes first (and, at the `k` boundary, which one is picked at all)
//! is whatever those algorithms do. Every llama.cpp Linux build uses GCC's library, and
//! test-backend-ops compares the picked set (TOPK_MOE's sqrt(softplus) gating maps distinct
//! random logits to equal probabilities now and then), so ties must fall exactly as there.
//!
//! `less` must be a strict weak order (the callers give NaN a place); the loop guards below
//! never change the result for one, they only keep a bad order from reading out of bounds.

/// libstdc++'s `_S_threshold`: ranges this short are left to the final insertion sort.
const THRESHOLD: usize = 16;

/// `std::sort(v.begin(), v.end(), less)`.
pub(super) fn sort(v: &mut [usize], less: &impl Fn(usize, usize) -> bool) {
    if v.len() < 2 {
        return;
    }
    introsort_loop(v, 2 * v.len().ilog2() as usize, less);
    final_insertion_sort(v, less);
}

/// `std::partial_sort(v.begin(), v.begin() + middle, v.end(), less)`: the `middle` least
/// elements, in order, in front.
pub(super) fn partial_sort(v: &mut [usize], middle: usize, less: &impl Fn(usize, usize) -> bool) {
    let middle = middle.min(v.len());
    heap_select(v, middle, less);
    sort_heap(&mut v[..middle], less);
}

fn introsort_loop(v: &mut [usize], mut depth_limit: usize, less: &impl Fn(usize, usize) -> bool) {
    let mut last = v.len();
    while last > THRESHOLD {
        if depth_limit == 0 {
            partial_sort(&mut v[..last], last, less);
            return;
        }
        depth_limit -= 1;
        let cut = partition_around_median(&mut v[..last], less);
        introsort_loop(&mut v[cut..last], depth_limit, less);
        last = cut;
    }
}

/// `__unguarded_partition_pivot`: the median of the second, middle and last elements moves to
/// the front and the rest is partitioned around it; returns the cut.
fn partition_around_median(v: &mut [usize], less: &impl Fn(usize, usize) -> bool) -> usize {
    let n = v.len();
    let median = median_of_three(v, 1, n / 2, n - 1, less);
    v.swap(0, median);
    let (mut first, mut last) = (1, n);
    loop {
        while first < n && less(v[first], v[0]) {
            first += 1;
        }
        last -= 1;
        while last > 0 && less(v[0], v[last]) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        v.swap(first, last);
        first += 1;
    }
}

/// `__move_median_to_first`'s choice among positions `a`, `b`, `c`.
fn median_of_three(
    v: &[usize],
    a: usize,
    b: usize,
    c: usize,
    less: &impl Fn(usize, usize) -> bool,
) -> usize {
    let lt = |x: usize, y: usize| less(v[x], v[y]);
    if lt(a, b) {
        if lt(b, c) {
            b
        } else if lt(a, c) {
            c
        } else {
            a
        }
    } else if lt(a, c) {
        a
    } else if lt(b, c) {
        c
    } else {
        b
    }
}

fn final_insertion_sort(v: &mut [usize], less: &impl Fn(usize, usize) -> bool) {
    if v.len() > THRESHOLD {
        insertion_sort(&mut v[..THRESHOLD], less);
        for i in THRESHOLD..v.len() {
            linear_insert(v, i, less);
        }
    } else {
        insertion_sort(v, less);
    }
}

fn insertion_sort(v: &mut [usize], less: &impl Fn(usize, usize) -> bool) {
    for i in 1..v.len() {
        if less(v[i], v[0]) {
            v[..=i].rotate_right(1);
        } else {
            linear_insert(v, i, less);
        }
    }
}

/// `__unguarded_linear_insert`: element `i` moves left past every element it is less than.
fn linear_insert(v: &mut [usize], i: usize, less: &impl Fn(usize, usize) -> bool) {
    let value = v[i];
    let mut hole = i;
    while hole > 0 && less(value, v[hole - 1]) {
        v[hole] = v[hole - 1];
        hole -= 1;
    }
    v[hole] = value;
}

fn heap_select(v: &mut [usize], middle: usize, less: &impl Fn(usize, usize) -> bool) {
    make_heap(&mut v[..middle], less);
    for i in middle..v.len() {
        if middle > 0 && less(v[i], v[0]) {
            let value = v[i];
            v[i] = v[0];
            adjust_heap(&mut v[..middle], 0, value, less);
        }
    }
}

fn make_heap(heap: &mut [usize], less: &impl Fn(usize, usize) -> bool) {
    let len = heap.len();
    if len < 2 {
        return;
    }
    for parent in (0..=(len - 2) / 2).rev() {
        adjust_heap(heap, parent, heap[parent], less);
    }
}

fn sort_heap(heap: &mut [usize], less: &impl Fn(usize, usize) -> bool) {
    for last in (1..heap.len()).rev() {
        let value = heap[last];
        heap[last] = heap[0];
        adjust_heap(&mut heap[..last], 0, value, less);
    }
}

/// `__adjust_heap`: the hole at `hole` sinks to a leaf along the greater children, then
/// `value` rises from there (`__push_heap`) no higher than where the hole started.
fn adjust_heap(
    heap: &mut [usize],
    mut hole: usize,
    value: usize,
    less: &impl Fn(usize, usize) -> bool,
) {
    let len = heap.len();
    if len == 0 {
        return;
    }
    let top = hole;
    let mut child = hole;
    while child < (len - 1) / 2 {
        child = 2 * (child + 1);
        if less(heap[child], heap[child - 1]) {
            child -= 1;
        }
        heap[hole] = heap[child];
        hole = child;
    }
    if len.is_multiple_of(2) && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        heap[hole] = heap[child - 1];
        hole = child - 1;
    }
    while hole > top {
        let parent = (hole - 1) / 2;
        if !less(heap[parent], value) {
            break;
        }
        heap[hole] = heap[parent];
        hole = parent;
    }
    heap[hole] = value;
}
