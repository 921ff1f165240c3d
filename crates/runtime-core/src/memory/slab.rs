//! Size-class (slab) allocator for small device allocations.
//!
//! [`Slab`] owns the bookkeeping for requests of at most [`SLAB_MAX`] (32 KiB, the split point:
//! larger requests go to the buddy allocator). Each request is rounded up to one of
//! [`NUM_CLASSES`] size classes and served from a *span*, a contiguous block of [`SPAN_SIZE`]
//! (256 KiB) carved into equal objects of one class. The slab does not allocate spans itself and does not depend
//! on the buddy: when a class has no room, [`Slab::alloc`] answers [`SlabAlloc::NeedSpan`] and
//! the caller obtains a span (naturally aligned to its size) wherever it likes, registers it
//! with [`Slab::add_span`] and retries. Like the buddy it only manages offsets, never memory.
//!
//! # Size classes
//!
//! Multiples of 64 up to 512 (8 classes), then four classes per doubling up to 32 KiB
//! (24 classes). Every span has the same size, [`SPAN_SIZE`], so it holds at least 8 objects,
//! and a span given back by one class fits any other: the space spans are taken from never
//! fragments. The bytes after a span's last whole object (the span tail) are never used.
//!
//! | class | size (B) | objects | tail (B) | | class | size (B) | objects | tail (B) |
//! |------:|---------:|--------:|---------:|-|------:|---------:|--------:|---------:|
//! |     0 |       64 |    4096 |        0 | |    16 |     2560 |     102 |     1024 |
//! |     1 |      128 |    2048 |        0 | |    17 |     3072 |      85 |     1024 |
//! |     2 |      192 |    1365 |       64 | |    18 |     3584 |      73 |      512 |
//! |     3 |      256 |    1024 |        0 | |    19 |     4096 |      64 |        0 |
//! |     4 |      320 |     819 |       64 | |    20 |     5120 |      51 |     1024 |
//! |     5 |      384 |     682 |      256 | |    21 |     6144 |      42 |     4096 |
//! |     6 |      448 |     585 |       64 | |    22 |     7168 |      36 |     4096 |
//! |     7 |      512 |     512 |        0 | |    23 |     8192 |      32 |        0 |
//! |     8 |      640 |     409 |      384 | |    24 |    10240 |      25 |     6144 |
//! |     9 |      768 |     341 |      256 | |    25 |    12288 |      21 |     4096 |
//! |    10 |      896 |     292 |      512 | |    26 |    14336 |      18 |     4096 |
//! |    11 |     1024 |     256 |        0 | |    27 |    16384 |      16 |        0 |
//! |    12 |     1280 |     204 |     1024 | |    28 |    20480 |      12 |    16384 |
//! |    13 |     1536 |     170 |     1024 | |    29 |    24576 |      10 |    16384 |
//! |    14 |     1792 |     146 |      512 | |    30 |    28672 |       9 |     4096 |
//! |    15 |     2048 |     128 |        0 | |    31 |    32768 |       8 |        0 |
//!
//! # Alignment
//!
//! Every object starts at a multiple of [`SLAB_ALIGN`] (64 B): class sizes are multiples of 64
//! and spans are aligned to their own size. Objects are *not* aligned to their class size in
//! general (640-byte objects sit at multiples of 640 from the span start); objects of the
//! power-of-two classes are.
//!
//! # Worst-case internal waste
//!
//! For a request of `s` bytes served by a class of `c` bytes, the waste is `c - s`:
//!
//! * `1 <= s <= 512`: at most 63 bytes. Relative to the object that is below 50% once
//!   `s > 64` (at most 63 of 128 bytes), but up to 63 of 64 bytes for tiny requests.
//!   (Zero-byte requests never reach the slab: the device allocator serves them without a
//!   slot.)
//! * `512 < s <= 32768`: the classes of a doubling `(2^k, 2^(k+1)]` are `2^(k-2)` apart, so the
//!   waste is below `2^(k-2)`, which is under 25% of the request and under 20% of the object.
//!
//! On top of that each span loses its tail: at most 6.25% of the span (classes 28 and 29),
//! nothing for the power-of-two classes.
//!
//! # Complexity
//!
//! `alloc` and `free` are `O(log n)` in the number of spans of the class (one `HashMap` lookup
//! and at most one `BTreeSet` update). `add_span` is `O(objects per span)` (at most 4096) to
//! build the span's free-slot stack; `take_empty_spans` is linear in what it returns.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

/// Largest size served by the slab (the split point): 32 KiB. Above it the caller uses the
/// buddy allocator.
pub const SLAB_MAX: u64 = 32 * 1024;

#[cfg(test)]
/// Every slab object starts at a multiple of this many bytes.
pub const SLAB_ALIGN: u64 = 64;

/// Number of size classes.
pub const NUM_CLASSES: usize = CLASS_SIZES.len();

/// Class sizes in bytes, ascending (see the table in the module documentation).
const CLASS_SIZES: [u64; 32] = [
    64, 128, 192, 256, 320, 384, 448, 512, //
    640, 768, 896, 1024, //
    1280, 1536, 1792, 2048, //
    2560, 3072, 3584, 4096, //
    5120, 6144, 7168, 8192, //
    10240, 12288, 14336, 16384, //
    20480, 24576, 28672, 32768,
];

/// Size of every span: 8 objects of the largest class.
pub const SPAN_SIZE: u64 = 256 * 1024;

/// The class serving `size` bytes: the smallest class at least `size` bytes large (size 0 maps
/// to class 0). `None` if `size > SLAB_MAX`.
pub fn class_of(size: u64) -> Option<usize> {
    (size <= SLAB_MAX).then(|| CLASS_SIZES.partition_point(|&class_size| class_size < size))
}

/// Object size of `class` in bytes.
///
/// # Panics
///
/// If `class >= NUM_CLASSES`.
pub fn class_size(class: usize) -> u64 {
    CLASS_SIZES[class]
}

/// Size of the spans `class` is carved from: [`SPAN_SIZE`] for every class.
///
/// It is a power of two, so a span obtained from the buddy allocator is naturally aligned to it.
///
/// # Panics
///
/// If `class >= NUM_CLASSES`.
pub fn span_size(class: usize) -> u64 {
    assert!(class < NUM_CLASSES, "no slab class {class}");
    SPAN_SIZE
}

/// Whole objects of `class` that fit in one span.
fn objects_per_span(class: usize) -> u32 {
    // At most 256 KiB / 64 B = 4096.
    (span_size(class) / class_size(class)) as u32
}

/// Why [`Slab::free`] rejected an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlabError {
    /// The size is larger than [`SLAB_MAX`], so the slab never served it.
    TooLarge {
        /// The size passed by the caller.
        size: u64,
    },
    /// No span of the size's class contains the offset.
    UnknownSpan {
        /// The offset passed by the caller.
        offset: u64,
    },
    /// The offset lies in a span of another class than the size maps to.
    SizeMismatch {
        /// The offset passed by the caller.
        offset: u64,
        /// The size passed by the caller.
        size: u64,
        /// Object size of the span the offset lies in.
        span_class_size: u64,
    },
    /// The offset is not the start of an object of its span.
    Misaligned {
        /// The offset passed by the caller.
        offset: u64,
        /// Object size of the span.
        class_size: u64,
    },
    /// The object is not allocated.
    DoubleFree {
        /// The offset passed by the caller.
        offset: u64,
    },
}

impl fmt::Display for SlabError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::TooLarge { size } => {
                write!(f, "size {size} exceeds the slab maximum of {SLAB_MAX}")
            }
            Self::UnknownSpan { offset } => write!(f, "offset {offset:#x} is in no slab span"),
            Self::SizeMismatch {
                offset,
                size,
                span_class_size,
            } => write!(
                f,
                "size {size} does not match the {span_class_size}-byte objects at {offset:#x}"
            ),
            Self::Misaligned { offset, class_size } => write!(
                f,
                "offset {offset:#x} is not the start of a {class_size}-byte slab object"
            ),
            Self::DoubleFree { offset } => {
                write!(f, "slab object at {offset:#x} is already free")
            }
        }
    }
}

impl std::error::Error for SlabError {}

/// Answer of [`Slab::alloc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlabAlloc {
    /// Offset of the allocated object.
    Ok(u64),
    /// The class has no room: obtain a block of `span_size` bytes aligned to `span_size`, pass
    /// it to [`Slab::add_span`] and call [`Slab::alloc`] again.
    NeedSpan {
        /// Class that needs a span.
        class: usize,
        /// Size (and alignment) of the span to obtain, [`span_size(class)`](span_size).
        span_size: u64,
    },
}

/// Bookkeeping of one span.
#[derive(Debug)]
struct Span {
    class: usize,
    /// Free object indices; popped from the end, so a fresh span hands out ascending addresses
    /// and afterwards the most recently freed slot comes first.
    free: Vec<u32>,
    /// One bit per object, set while it is allocated (double-free detection).
    live: Vec<u64>,
}

impl Span {
    fn new(class: usize) -> Self {
        let objects = objects_per_span(class);
        Self {
            class,
            free: (0..objects).rev().collect(),
            live: vec![0; objects.div_ceil(64) as usize],
        }
    }

    fn is_live(&self, index: u32) -> bool {
        self.live[index as usize / 64] & (1 << (index % 64)) != 0
    }

    fn toggle_live(&mut self, index: u32) {
        self.live[index as usize / 64] ^= 1 << (index % 64);
    }
}

/// Hashes span offsets (one `u64` per key) with the splitmix64 finaliser: a few multiplies
/// instead of SipHash, which was an eighth of a small alloc + free pair. Offsets are not
/// attacker-chosen (the allocator picks them), so no DoS-resistant hash is needed; the
/// finaliser spreads their zero low bits (spans are aligned) over the whole word.
#[derive(Default)]
struct OffsetHasher(u64);

impl Hasher for OffsetHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = x;
    }

    fn finish(&self) -> u64 {
        let mut z = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Size-class allocator handing out offsets of small objects inside caller-provided spans.
///
/// A span is *partial* while it has both live objects and free slots, *full* without free
/// slots, and *empty* without live objects. Empty spans stay cached (counted in
/// [`reserved_bytes`](Self::reserved_bytes)) until [`take_empty_spans`](Self::take_empty_spans)
/// or [`take_one_empty_span`](Self::take_one_empty_span) hands them back.
#[derive(Debug)]
pub struct Slab {
    spans: HashMap<u64, Span, BuildHasherDefault<OffsetHasher>>,
    /// Per class: offsets of the partial spans.
    partial: [BTreeSet<u64>; NUM_CLASSES],
    /// Per class: offsets of the empty spans.
    empty: [BTreeSet<u64>; NUM_CLASSES],
    allocated: u64,
    reserved: u64,
    live: usize,
}

impl Default for Slab {
    fn default() -> Self {
        Self::new()
    }
}

impl Slab {
    /// An allocator without spans.
    pub fn new() -> Self {
        Self {
            spans: HashMap::default(),
            partial: [const { BTreeSet::new() }; NUM_CLASSES],
            empty: [const { BTreeSet::new() }; NUM_CLASSES],
            allocated: 0,
            reserved: 0,
            live: 0,
        }
    }

    /// Allocates one object of [`class_of(size)`](class_of).
    ///
    /// Serves from the lowest-address partial span of the class, else from its lowest-address
    /// empty span, else answers [`SlabAlloc::NeedSpan`]. Lowest address first (address-ordered
    /// first fit) is deterministic, costs one `BTreeSet::first` per allocation, and packs live
    /// objects into the low spans so that high spans drain and can be handed back to the buddy;
    /// preferring the fullest span would need a priority structure re-keyed on every allocation
    /// and free for a similar effect.
    ///
    /// # Panics
    ///
    /// If `size > SLAB_MAX`; the caller routes such sizes to the buddy allocator.
    pub fn alloc(&mut self, size: u64) -> SlabAlloc {
        let Some(class) = class_of(size) else {
            panic!("slab alloc of {size} bytes exceeds SLAB_MAX ({SLAB_MAX})");
        };
        let span_offset = match self.partial[class].first() {
            Some(&offset) => offset,
            None => match self.empty[class].pop_first() {
                Some(offset) => {
                    self.partial[class].insert(offset);
                    offset
                }
                None => {
                    return SlabAlloc::NeedSpan {
                        class,
                        span_size: span_size(class),
                    }
                }
            },
        };
        let span = self
            .spans
            .get_mut(&span_offset)
            .expect("partial and empty spans are registered");
        let index = span.free.pop().expect("partial spans have a free slot");
        span.toggle_live(index);
        if span.free.is_empty() {
            self.partial[class].remove(&span_offset);
        }
        let size = class_size(class);
        self.allocated += size;
        self.live += 1;
        SlabAlloc::Ok(span_offset + u64::from(index) * size)
    }

    /// Registers the span `[span_offset, span_offset + span_size(class))` for `class` as empty.
    ///
    /// # Panics
    ///
    /// If `class >= NUM_CLASSES`, `span_offset` is not a multiple of `span_size(class)`, or a
    /// span is already registered at `span_offset`.
    pub fn add_span(&mut self, class: usize, span_offset: u64) {
        let size = span_size(class);
        assert!(
            span_offset & (size - 1) == 0,
            "span {span_offset:#x} is not aligned to its size {size:#x}"
        );
        assert!(
            !self.spans.contains_key(&span_offset),
            "span {span_offset:#x} is already registered"
        );
        self.spans.insert(span_offset, Span::new(class));
        self.empty[class].insert(span_offset);
        self.reserved += size;
    }

    /// Frees the object at `offset`, given the size originally requested for it, and returns
    /// the class size freed. On error nothing changes.
    pub fn free(&mut self, offset: u64, size: u64) -> Result<u64, SlabError> {
        let class = class_of(size).ok_or(SlabError::TooLarge { size })?;
        let span_offset = offset & !(span_size(class) - 1);
        let span = self
            .spans
            .get_mut(&span_offset)
            .ok_or(SlabError::UnknownSpan { offset })?;
        if span.class != class {
            return Err(SlabError::SizeMismatch {
                offset,
                size,
                span_class_size: class_size(span.class),
            });
        }
        let size = class_size(class);
        let relative = offset - span_offset;
        let index = relative / size;
        let objects = objects_per_span(class);
        if index * size != relative || index >= u64::from(objects) {
            return Err(SlabError::Misaligned {
                offset,
                class_size: size,
            });
        }
        let index = index as u32;
        if !span.is_live(index) {
            return Err(SlabError::DoubleFree { offset });
        }
        span.toggle_live(index);
        span.free.push(index);
        if span.free.len() == objects as usize {
            self.partial[class].remove(&span_offset);
            self.empty[class].insert(span_offset);
        } else if span.free.len() == 1 {
            self.partial[class].insert(span_offset);
        }
        self.allocated -= size;
        self.live -= 1;
        Ok(size)
    }

    /// Removes all empty spans and returns them as `(offset, span_size)`, by class, then
    /// address, so the caller can give them back to the buddy allocator.
    pub fn take_empty_spans(&mut self) -> Vec<(u64, u64)> {
        let mut taken = Vec::new();
        for (class, empty) in self.empty.iter_mut().enumerate() {
            let size = span_size(class);
            for offset in std::mem::take(empty) {
                self.spans.remove(&offset);
                self.reserved -= size;
                taken.push((offset, size));
            }
        }
        taken
    }

    #[cfg(test)]
    /// Removes one empty span and returns it as `(offset, span_size)`, `None` if there is none.
    ///
    /// Takes the lowest-address empty span of the highest class that has one.
    pub fn take_one_empty_span(&mut self) -> Option<(u64, u64)> {
        let (class, offset) = self
            .empty
            .iter_mut()
            .enumerate()
            .rev()
            .find_map(|(class, empty)| Some((class, empty.pop_first()?)))?;
        self.spans.remove(&offset);
        let size = span_size(class);
        self.reserved -= size;
        Some((offset, size))
    }

    /// Sum of the class sizes of the live objects.
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated
    }

    #[cfg(test)]
    /// Sum of the sizes of all spans held (partial, full and empty).
    pub fn reserved_bytes(&self) -> u64 {
        self.reserved
    }

    #[cfg(test)]
    /// Number of live objects.
    pub fn live_objects(&self) -> usize {
        self.live
    }

    /// Number of cached empty spans (`O(NUM_CLASSES)`).
    pub fn empty_span_count(&self) -> usize {
        self.empty.iter().map(BTreeSet::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Allocates through `alloc`, satisfying `NeedSpan` from a bump pointer.
    fn alloc_with(slab: &mut Slab, next_span: &mut u64, size: u64) -> u64 {
        loop {
            match slab.alloc(size) {
                SlabAlloc::Ok(offset) => return offset,
                SlabAlloc::NeedSpan { class, span_size } => {
                    let span = next_span.next_multiple_of(span_size);
                    *next_span = span + span_size;
                    slab.add_span(class, span);
                }
            }
        }
    }

    #[test]
    fn class_table() {
        assert_eq!(NUM_CLASSES, 32);
        assert_eq!(class_size(NUM_CLASSES - 1), SLAB_MAX);
        for class in 0..NUM_CLASSES {
            let size = class_size(class);
            assert_eq!(size % SLAB_ALIGN, 0);
            assert_eq!(class_of(size), Some(class));
            if class > 0 {
                assert!(size > class_size(class - 1));
                assert_eq!(class_of(class_size(class - 1) + 1), Some(class));
            }
            let span = span_size(class);
            assert!(span.is_power_of_two() && span == SPAN_SIZE);
            assert!(objects_per_span(class) >= 8);
            // Span tail at most 6.25%.
            assert!((span % size) * 16 <= span, "class {class}");
        }
        assert_eq!(objects_per_span(0), 4096);
        assert_eq!(objects_per_span(31), 8);
    }

    #[test]
    fn class_of_edges() {
        for (size, class_bytes) in [
            (0, 64),
            (1, 64),
            (64, 64),
            (65, 128),
            (512, 512),
            (513, 640),
            (4095, 4096),
            (4096, 4096),
            (4097, 5120),
            (SLAB_MAX, SLAB_MAX),
        ] {
            assert_eq!(class_of(size).map(class_size), Some(class_bytes), "{size}");
        }
        assert_eq!(class_of(SLAB_MAX + 1), None);
        assert_eq!(class_of(u64::MAX), None);
    }

    #[test]
    fn waste_bounds() {
        for size in 1..=SLAB_MAX {
            let waste = class_size(class_of(size).unwrap()) - size;
            if size <= 512 {
                assert!(waste < 64, "{size}");
            } else {
                assert!(waste * 4 < size, "{size}");
                assert!(waste * 5 < class_size(class_of(size).unwrap()), "{size}");
            }
        }
    }

    #[test]
    fn alloc_needs_span_then_serves_ascending() {
        let mut slab = Slab::new();
        assert_eq!(
            slab.alloc(100),
            SlabAlloc::NeedSpan {
                class: 1,
                span_size: SPAN_SIZE
            }
        );
        slab.add_span(1, 0x10_0000);
        assert_eq!(slab.empty_span_count(), 1);
        assert_eq!(slab.reserved_bytes(), SPAN_SIZE);
        assert_eq!(slab.alloc(100), SlabAlloc::Ok(0x10_0000));
        assert_eq!(slab.alloc(128), SlabAlloc::Ok(0x10_0080));
        assert_eq!(slab.empty_span_count(), 0);
        assert_eq!(slab.allocated_bytes(), 256);
        assert_eq!(slab.live_objects(), 2);
        assert_eq!(slab.free(0x10_0000, 100), Ok(128));
        assert_eq!(slab.free(0x10_0080, 65), Ok(128));
        assert_eq!(slab.empty_span_count(), 1);
        assert_eq!(slab.take_empty_spans(), vec![(0x10_0000, SPAN_SIZE)]);
        assert_eq!(slab.reserved_bytes(), 0);
        assert_eq!(
            slab.alloc(100),
            SlabAlloc::NeedSpan {
                class: 1,
                span_size: SPAN_SIZE
            }
        );
    }

    #[test]
    fn full_span_requests_another_and_prefers_low_addresses() {
        let mut slab = Slab::new();
        let class = class_of(SLAB_MAX).unwrap();
        slab.add_span(class, 0);
        let first: Vec<_> = (0..8)
            .map(|_| match slab.alloc(SLAB_MAX) {
                SlabAlloc::Ok(offset) => offset,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(first, (0..8).map(|i| i * SLAB_MAX).collect::<Vec<_>>());
        assert!(matches!(slab.alloc(SLAB_MAX), SlabAlloc::NeedSpan { .. }));
        slab.add_span(class, 1 << 20);
        assert_eq!(slab.alloc(SLAB_MAX), SlabAlloc::Ok(1 << 20));
        // A slot freed in the low span is preferred over the partial high span.
        slab.free(3 * SLAB_MAX, SLAB_MAX).unwrap();
        assert_eq!(slab.alloc(SLAB_MAX - 1), SlabAlloc::Ok(3 * SLAB_MAX));
        assert_eq!(slab.alloc(SLAB_MAX), SlabAlloc::Ok((1 << 20) + SLAB_MAX));
    }

    #[test]
    fn free_errors_change_nothing() {
        let mut slab = Slab::new();
        let mut next = 0;
        let a = alloc_with(&mut slab, &mut next, 640);
        let b = alloc_with(&mut slab, &mut next, 64);
        assert_eq!((a, b), (0, SPAN_SIZE));
        let (allocated, live) = (slab.allocated_bytes(), slab.live_objects());

        assert_eq!(
            slab.free(a, SLAB_MAX + 1),
            Err(SlabError::TooLarge { size: SLAB_MAX + 1 })
        );
        assert_eq!(
            slab.free(1 << 30, 640),
            Err(SlabError::UnknownSpan { offset: 1 << 30 })
        );
        // Wrong size: 64 B maps to class 0, but the span at 0 is class 8.
        assert_eq!(
            slab.free(a, 64),
            Err(SlabError::SizeMismatch {
                offset: a,
                size: 64,
                span_class_size: 640
            })
        );
        // Wrong size the other way: the span at `b` holds 64-byte objects.
        assert_eq!(
            slab.free(b, SLAB_MAX),
            Err(SlabError::SizeMismatch {
                offset: b,
                size: SLAB_MAX,
                span_class_size: 64
            })
        );
        assert_eq!(
            slab.free(a + 64, 640),
            Err(SlabError::Misaligned {
                offset: a + 64,
                class_size: 640
            })
        );
        // In the span tail, past the last whole object (409 * 640 = 261760).
        assert_eq!(
            slab.free(a + 409 * 640, 640),
            Err(SlabError::Misaligned {
                offset: a + 409 * 640,
                class_size: 640
            })
        );
        assert_eq!(
            slab.free(a + 640, 600),
            Err(SlabError::DoubleFree { offset: a + 640 })
        );
        assert_eq!(
            (slab.allocated_bytes(), slab.live_objects()),
            (allocated, live)
        );

        assert_eq!(slab.free(a, 640), Ok(640));
        assert_eq!(slab.free(a, 640), Err(SlabError::DoubleFree { offset: a }));
        assert_eq!(slab.free(b, 1), Ok(64));
        assert_eq!(slab.free(b, 1), Err(SlabError::DoubleFree { offset: b }));
        assert_eq!(slab.live_objects(), 0);
        assert_eq!(slab.allocated_bytes(), 0);
        assert_eq!(slab.empty_span_count(), 2);
        assert_eq!(
            SlabError::DoubleFree { offset: 0x40 }.to_string(),
            "slab object at 0x40 is already free"
        );
    }

    #[test]
    #[should_panic(expected = "exceeds SLAB_MAX")]
    fn alloc_too_large_panics() {
        let _ = Slab::default().alloc(SLAB_MAX + 1);
    }

    #[test]
    #[should_panic(expected = "not aligned")]
    fn add_span_rejects_misaligned() {
        Slab::new().add_span(0, 4096);
    }

    #[test]
    #[should_panic(expected = "already registered")]
    fn add_span_rejects_duplicates() {
        let mut slab = Slab::new();
        slab.add_span(0, 0);
        slab.add_span(1, 0);
    }

    #[test]
    fn take_one_empty_span_prefers_high_classes() {
        let mut slab = Slab::new();
        assert_eq!(slab.take_one_empty_span(), None);
        slab.add_span(0, 2 << 20);
        slab.add_span(31, 1 << 20);
        slab.add_span(31, 0);
        assert_eq!(slab.take_one_empty_span(), Some((0, SPAN_SIZE)));
        assert_eq!(slab.take_one_empty_span(), Some((1 << 20, SPAN_SIZE)));
        assert_eq!(slab.take_one_empty_span(), Some((2 << 20, SPAN_SIZE)));
        assert_eq!(slab.take_one_empty_span(), None);
        assert_eq!(slab.reserved_bytes(), 0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(u64),
        Free(usize),
        TakeEmpty,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => (0..=1024u64).prop_map(Op::Alloc),
            2 => (0..=SLAB_MAX).prop_map(Op::Alloc),
            // A few large classes (8 to 12 objects per span) so spans fill up.
            2 => prop::sample::select(&[5000, 20_000, SLAB_MAX][..]).prop_map(Op::Alloc),
            4 => any::<usize>().prop_map(Op::Free),
            1 => Just(Op::TakeEmpty),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn random_alloc_free_matches_model(ops in prop::collection::vec(op(), 1..200)) {
            let mut slab = Slab::new();
            let mut next_span = 0u64;
            // Spans handed to the slab: offset -> (class, size).
            let mut spans: HashMap<u64, (usize, u64)> = HashMap::new();
            // Live objects: (offset, requested size).
            let mut live: Vec<(u64, u64)> = Vec::new();
            // Spans given back by `take_empty_spans`, reused before bumping.
            let mut returned: Vec<(u64, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc(size) => {
                        let offset = loop {
                            match slab.alloc(size) {
                                SlabAlloc::Ok(offset) => break offset,
                                SlabAlloc::NeedSpan { class, span_size } => {
                                    prop_assert_eq!(span_size, super::span_size(class));
                                    // Only when every span of the class is full.
                                    let held = spans.values().filter(|s| s.0 == class).count();
                                    let used = live
                                        .iter()
                                        .filter(|&&(_, size)| class_of(size) == Some(class))
                                        .count();
                                    prop_assert_eq!(used, held * objects_per_span(class) as usize);
                                    let reuse = returned.iter().position(|&(_, s)| s == span_size);
                                    let span = match reuse {
                                        Some(i) => returned.swap_remove(i).0,
                                        None => {
                                            let span = next_span.next_multiple_of(span_size);
                                            next_span = span + span_size;
                                            span
                                        }
                                    };
                                    slab.add_span(class, span);
                                    spans.insert(span, (class, span_size));
                                }
                            }
                        };
                        let class = class_of(size).unwrap();
                        prop_assert_eq!(offset % SLAB_ALIGN, 0);
                        let span = offset & !(span_size(class) - 1);
                        prop_assert_eq!(spans.get(&span), Some(&(class, span_size(class))));
                        prop_assert!(offset + class_size(class) <= span + span_size(class));
                        live.push((offset, size));
                    }
                    Op::Free(index) if !live.is_empty() => {
                        let (offset, size) = live.swap_remove(index % live.len());
                        let freed = slab.free(offset, size).unwrap();
                        prop_assert_eq!(freed, class_size(class_of(size).unwrap()));
                        prop_assert_eq!(slab.free(offset, size), Err(SlabError::DoubleFree { offset }));
                    }
                    Op::Free(_) => {}
                    Op::TakeEmpty => {
                        for (span, size) in slab.take_empty_spans() {
                            prop_assert_eq!(spans.remove(&span).map(|(_, s)| s), Some(size));
                            prop_assert!(live.iter().all(|&(o, _)| o & !(size - 1) != span));
                            returned.push((span, size));
                        }
                        prop_assert_eq!(slab.empty_span_count(), 0);
                    }
                }
                let mut ranges: Vec<_> = live
                    .iter()
                    .map(|&(offset, size)| (offset, class_size(class_of(size).unwrap())))
                    .collect();
                ranges.sort_unstable();
                for pair in ranges.windows(2) {
                    prop_assert!(pair[0].0 + pair[0].1 <= pair[1].0, "overlap {:?}", pair);
                }
                prop_assert_eq!(slab.allocated_bytes(), ranges.iter().map(|r| r.1).sum::<u64>());
                prop_assert_eq!(slab.live_objects(), live.len());
                prop_assert_eq!(slab.reserved_bytes(), spans.values().map(|s| s.1).sum::<u64>());
            }
            for (offset, size) in live.drain(..) {
                slab.free(offset, size).unwrap();
            }
            prop_assert_eq!(slab.allocated_bytes(), 0);
            prop_assert_eq!(slab.live_objects(), 0);
            prop_assert_eq!(slab.empty_span_count(), spans.len());
            let mut taken = slab.take_empty_spans();
            taken.sort_unstable();
            let mut expected: Vec<_> = spans.iter().map(|(&o, &(_, s))| (o, s)).collect();
            expected.sort_unstable();
            prop_assert_eq!(taken, expected);
            prop_assert_eq!(slab.reserved_bytes(), 0);
        }
    }
}
