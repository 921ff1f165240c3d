//! Binary buddy allocator over the offsets of a device address space.
//!
//! [`Buddy`] owns the bookkeeping for `[0, capacity)` of the virtual device's memory: which
//! offsets are free and which are handed out. It never touches memory itself; callers get back
//! offsets and turn them into whatever handle they need.
//!
//! # Blocks and orders
//!
//! A block of order `o` is `min_block << o` bytes and starts at a multiple of its own size
//! (natural alignment). `min_block` is a power of two of at least 64 bytes (the runtime uses
//! 4096). The capacity is rounded down to a multiple of `min_block`; it need not be a power of
//! two. Initially the free blocks are the greedy decomposition of `[0, capacity)` into naturally
//! aligned power-of-two blocks (one block per set bit of `capacity / min_block`, largest first).
//!
//! Each order keeps its free blocks in a `BTreeSet<u64>`, so the lowest free address of an order
//! is found in `O(log n)` and every operation costs `O(orders * log n)`, where `orders` is
//! `log2(capacity / min_block) + 1` and `n` the number of free blocks of one order. Freed blocks
//! are merged with their buddies eagerly, so once everything is freed the free lists are exactly
//! the initial decomposition again.
//!
//! # Two ways to allocate
//!
//! The device allocator uses only the first, with a single block size (its slab spans), so its
//! free space never fragments; exact allocation is compiled for the tests only.
//!
//! * [`Buddy::alloc_block`] hands out one naturally aligned block of a power-of-two size.
//! * [`Buddy::alloc`] is "exact" allocation (like Linux `alloc_pages_exact`): the size is rounded
//!   up to a multiple of `min_block` (see [`Buddy::rounded_size`]), a block of the next power of
//!   two is taken and its unused tail goes straight back to the free lists. The waste per
//!   allocation is therefore below `min_block` (at most `min_block - 1` bytes for a non-zero
//!   size; a zero-byte request consumes one `min_block`), and the returned offset is aligned to
//!   `rounded.next_power_of_two()`. Because that aligned block must be free as a whole, on a
//!   capacity that is not a power of two `alloc(capacity)` fails even on an empty allocator.
//!
//! # Freeing
//!
//! The allocator does not remember allocation sizes: the caller passes back the size it
//! allocated with. A free is rejected with a [`BuddyError`] when the region is out of range,
//! misaligned for that size, or overlaps memory that is already free (a double free, or a size
//! larger than the one allocated). A rejected free changes nothing. A size smaller than the
//! allocated one that stays inside allocated memory cannot be detected and leaks the rest.

use std::collections::BTreeSet;
use std::fmt;

/// Why [`Buddy::free`] or [`Buddy::free_block`] rejected a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuddyError {
    /// The size can never have been handed out: `free_block` got a size that is not a power of
    /// two of at least `min_block` bytes, or `free` got a size whose rounded length has no
    /// power-of-two block in `u64`.
    InvalidSize {
        /// The size passed to `free_block`, or the rounded length for `free`.
        size: u64,
    },
    /// The region does not lie inside `[0, capacity)`.
    OutOfRange {
        /// Start of the region.
        offset: u64,
        /// Length of the region after rounding.
        size: u64,
        /// Capacity of the allocator.
        capacity: u64,
    },
    /// The offset is not aligned the way an allocation of this size would be.
    Misaligned {
        /// Start of the region.
        offset: u64,
        /// Alignment an allocation of this size has.
        align: u64,
    },
    /// Part or all of the region is already free.
    DoubleFree {
        /// Start of the region.
        offset: u64,
        /// Length of the region after rounding.
        size: u64,
    },
}

impl fmt::Display for BuddyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::InvalidSize { size } => write!(f, "invalid buddy free size {size}"),
            Self::OutOfRange {
                offset,
                size,
                capacity,
            } => write!(
                f,
                "region {offset:#x}+{size:#x} lies outside the buddy capacity {capacity:#x}"
            ),
            Self::Misaligned { offset, align } => {
                write!(f, "offset {offset:#x} is not aligned to {align:#x}")
            }
            Self::DoubleFree { offset, size } => {
                write!(f, "region {offset:#x}+{size:#x} is already (partly) free")
            }
        }
    }
}

impl std::error::Error for BuddyError {}

/// Binary buddy allocator handing out offsets into `[0, capacity)`.
#[derive(Debug, Clone)]
pub struct Buddy {
    capacity: u64,
    /// `log2(min_block)`.
    min_shift: u32,
    /// Free block offsets, indexed by order.
    free: Vec<BTreeSet<u64>>,
    free_bytes: u64,
}

impl Buddy {
    /// Manages `[0, capacity)` with blocks of at least `min_block` bytes.
    ///
    /// `capacity` is rounded down to a multiple of `min_block` (a capacity below `min_block`
    /// yields an allocator that serves nothing). The initial free blocks are the greedy
    /// decomposition of `[0, capacity)` into naturally aligned power-of-two blocks.
    ///
    /// # Panics
    ///
    /// If `min_block` is not a power of two of at least 64.
    pub fn new(capacity: u64, min_block: u64) -> Self {
        assert!(
            min_block.is_power_of_two() && min_block >= 64,
            "buddy min_block must be a power of two >= 64, got {min_block}"
        );
        let min_shift = min_block.trailing_zeros();
        let capacity = capacity >> min_shift << min_shift;
        let orders = match capacity >> min_shift {
            0 => 1,
            blocks => blocks.ilog2() as usize + 1,
        };
        let mut buddy = Self {
            capacity,
            min_shift,
            free: vec![BTreeSet::new(); orders],
            free_bytes: capacity,
        };
        for (offset, order) in aligned_blocks(0, capacity, min_shift) {
            buddy.free[order].insert(offset);
        }
        buddy
    }

    /// Allocates one naturally aligned block of exactly `size` bytes.
    ///
    /// `size` must be a power of two of at least `min_block` (checked by a debug assertion;
    /// release builds return `None` for other sizes). The block comes from the smallest order
    /// that has a free block, lowest address first, split down as needed keeping the lower
    /// half, so the result is deterministic. Returns `None` if no such block is free.
    pub fn alloc_block(&mut self, size: u64) -> Option<u64> {
        let valid = size.is_power_of_two() && size >= self.min_block();
        debug_assert!(
            valid,
            "buddy alloc_block size {size} is not a power of two >= min_block"
        );
        if !valid {
            return None;
        }
        let offset = self.take_block(self.order_of(size)?)?;
        self.free_bytes -= size;
        Some(offset)
    }

    #[cfg(test)]
    /// Allocates [`rounded_size(size)`](Self::rounded_size) bytes ("exact" allocation).
    ///
    /// Takes a block of `rounded.next_power_of_two()` bytes and immediately returns its unused
    /// tail to the free lists as aligned power-of-two blocks, so less than `min_block` bytes are
    /// wasted. The returned offset is aligned to `rounded.next_power_of_two()`. Returns `None`
    /// if no free block of that size exists.
    pub fn alloc(&mut self, size: u64) -> Option<u64> {
        let rounded = self.rounded_size(size);
        let block = rounded.checked_next_power_of_two()?;
        let offset = self.take_block(self.order_of(block)?)?;
        for (tail, order) in aligned_blocks(offset + rounded, offset + block, self.min_shift) {
            self.insert_merged(tail, order);
        }
        self.free_bytes -= rounded;
        Some(offset)
    }

    #[cfg(test)]
    /// Frees what [`alloc(size)`](Self::alloc) returned, given the same `size`.
    ///
    /// `[offset, offset + rounded_size(size))` is split into aligned power-of-two blocks and
    /// each is freed, merging with free buddies. On error nothing changes.
    pub fn free(&mut self, offset: u64, size: u64) -> Result<(), BuddyError> {
        self.free_region(offset, self.rounded_size(size))
    }

    /// Frees a block returned by [`alloc_block(size)`](Self::alloc_block), given the same `size`.
    ///
    /// On error nothing changes.
    pub fn free_block(&mut self, offset: u64, size: u64) -> Result<(), BuddyError> {
        if !size.is_power_of_two() || size < self.min_block() {
            return Err(BuddyError::InvalidSize { size });
        }
        self.free_region(offset, size)
    }

    #[cfg(test)]
    /// Managed bytes: the constructor's capacity rounded down to a multiple of `min_block`.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    #[cfg(test)]
    /// Bytes currently free (tracked, `O(1)`).
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Bytes currently allocated: `capacity() - free_bytes()`.
    pub fn used_bytes(&self) -> u64 {
        self.capacity - self.free_bytes
    }

    #[cfg(test)]
    /// Size of the largest free block, 0 if nothing is free (`O(orders)`).
    ///
    /// `alloc_block(s)` succeeds exactly when `s <= largest_free_block()`, and `alloc(s)`
    /// exactly when `rounded_size(s).next_power_of_two() <= largest_free_block()`.
    pub fn largest_free_block(&self) -> u64 {
        self.free
            .iter()
            .rposition(|set| !set.is_empty())
            .map_or(0, |order| self.block_size(order))
    }

    #[cfg(test)]
    /// Number of free blocks over all orders (`O(orders)`).
    pub fn free_block_count(&self) -> usize {
        self.free.iter().map(BTreeSet::len).sum()
    }

    #[cfg(test)]
    /// Bytes that [`alloc(size)`](Self::alloc) consumes: `size` rounded up to a multiple of
    /// `min_block`, with 0 treated as 1. Saturates at `u64::MAX` (which never fits) when the
    /// rounding would overflow.
    pub fn rounded_size(&self, size: u64) -> u64 {
        size.max(1)
            .checked_next_multiple_of(self.min_block())
            .unwrap_or(u64::MAX)
    }

    fn min_block(&self) -> u64 {
        1 << self.min_shift
    }

    fn block_size(&self, order: usize) -> u64 {
        self.min_block() << order
    }

    /// Order of a power-of-two `size >= min_block`, `None` if larger than any block.
    fn order_of(&self, size: u64) -> Option<usize> {
        let order = (size >> self.min_shift).trailing_zeros() as usize;
        (order < self.free.len()).then_some(order)
    }

    /// Removes a block of `order` from the free lists, splitting the lowest-address block of the
    /// smallest non-empty larger order if needed. Does not update `free_bytes`.
    fn take_block(&mut self, order: usize) -> Option<u64> {
        let (from, offset) = self.free[order..]
            .iter_mut()
            .enumerate()
            .find_map(|(above, set)| set.pop_first().map(|offset| (order + above, offset)))?;
        for split in (order..from).rev() {
            let upper = offset + self.block_size(split);
            self.free[split].insert(upper);
        }
        Some(offset)
    }

    /// Inserts a free block, merging it with its buddy as long as the buddy is free.
    fn insert_merged(&mut self, mut offset: u64, mut order: usize) {
        while order + 1 < self.free.len() {
            let buddy = offset ^ self.block_size(order);
            if !self.free[order].remove(&buddy) {
                break;
            }
            offset = offset.min(buddy);
            order += 1;
        }
        self.free[order].insert(offset);
    }

    /// Whether any byte of `[start, end)` is free: for each order, one range query for a free
    /// block starting after `start - block_size` and before `end` (`O(orders * log n)`).
    fn overlaps_free(&self, start: u64, end: u64) -> bool {
        self.free.iter().enumerate().any(|(order, set)| {
            let lowest = start.saturating_sub(self.block_size(order) - 1);
            set.range(lowest..end).next().is_some()
        })
    }

    /// Frees `[offset, offset + len)`; `len` is a non-zero multiple of `min_block`.
    ///
    /// With `offset` aligned to `len.next_power_of_two()`, every block of the decomposition but
    /// the last has a buddy inside the region (still allocated), so only the last one merges and
    /// the whole free costs `O(orders * log n)`.
    fn free_region(&mut self, offset: u64, len: u64) -> Result<(), BuddyError> {
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= self.capacity)
            .ok_or(BuddyError::OutOfRange {
                offset,
                size: len,
                capacity: self.capacity,
            })?;
        let align = len
            .checked_next_power_of_two()
            .ok_or(BuddyError::InvalidSize { size: len })?;
        if offset & (align - 1) != 0 {
            return Err(BuddyError::Misaligned { offset, align });
        }
        if self.overlaps_free(offset, end) {
            return Err(BuddyError::DoubleFree { offset, size: len });
        }
        for (block, order) in aligned_blocks(offset, end, self.min_shift) {
            self.insert_merged(block, order);
        }
        self.free_bytes += len;
        Ok(())
    }
}

/// Splits `[start, end)` (both multiples of `1 << min_shift`) into the fewest naturally aligned
/// power-of-two blocks, in address order, as `(offset, order)` pairs: at each step the largest
/// block that is aligned at the cursor and fits before `end`.
fn aligned_blocks(start: u64, end: u64, min_shift: u32) -> impl Iterator<Item = (u64, usize)> {
    let mut cursor = start;
    std::iter::from_fn(move || {
        if cursor >= end {
            return None;
        }
        let align_order = cursor.trailing_zeros() - min_shift;
        let fit_order = ((end - cursor) >> min_shift).ilog2();
        let order = align_order.min(fit_order);
        let block = cursor;
        cursor += 1 << (order + min_shift);
        Some((block, order as usize))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PAGE: u64 = 4096;

    /// Free blocks as `(offset, size)` in address order.
    fn free_blocks(buddy: &Buddy) -> Vec<(u64, u64)> {
        let mut blocks: Vec<_> = buddy
            .free
            .iter()
            .enumerate()
            .flat_map(|(order, set)| set.iter().map(move |&offset| (offset, order)))
            .map(|(offset, order)| (offset, buddy.block_size(order)))
            .collect();
        blocks.sort_unstable();
        blocks
    }

    /// Structural invariants: free blocks are aligned, in range, disjoint, add up to
    /// `free_bytes`, and no two free buddies were left unmerged.
    fn check_invariants(buddy: &Buddy) {
        let blocks = free_blocks(buddy);
        let mut total = 0;
        let mut previous_end = 0;
        for &(offset, size) in &blocks {
            assert_eq!(offset % size, 0, "free block {offset:#x} misaligned");
            assert!(offset >= previous_end, "free blocks overlap at {offset:#x}");
            assert!(offset + size <= buddy.capacity());
            previous_end = offset + size;
            total += size;
        }
        assert_eq!(total, buddy.free_bytes());
        for (order, set) in buddy.free.iter().enumerate() {
            for &offset in set {
                let buddy_offset = offset ^ buddy.block_size(order);
                assert!(
                    !set.contains(&buddy_offset),
                    "unmerged buddies at {offset:#x}"
                );
            }
        }
        assert_eq!(buddy.used_bytes() + buddy.free_bytes(), buddy.capacity());
    }

    #[test]
    fn power_of_two_capacity_starts_as_one_block() {
        let buddy = Buddy::new(1 << 20, PAGE);
        assert_eq!(buddy.capacity(), 1 << 20);
        assert_eq!(free_blocks(&buddy), vec![(0, 1 << 20)]);
        assert_eq!(buddy.largest_free_block(), 1 << 20);
        assert_eq!(buddy.free_block_count(), 1);
        assert_eq!(buddy.used_bytes(), 0);
    }

    #[test]
    fn non_power_of_two_capacity_is_rounded_and_decomposed() {
        // 13 pages and a bit: 8 + 4 + 1 pages.
        let buddy = Buddy::new(13 * PAGE + 100, PAGE);
        assert_eq!(buddy.capacity(), 13 * PAGE);
        assert_eq!(
            free_blocks(&buddy),
            vec![(0, 8 * PAGE), (8 * PAGE, 4 * PAGE), (12 * PAGE, PAGE)]
        );
        assert_eq!(buddy.largest_free_block(), 8 * PAGE);
        assert_eq!(buddy.free_block_count(), 3);
        check_invariants(&buddy);
    }

    #[test]
    fn capacity_below_min_block_serves_nothing() {
        let mut buddy = Buddy::new(PAGE - 1, PAGE);
        assert_eq!(buddy.capacity(), 0);
        assert_eq!(buddy.largest_free_block(), 0);
        assert_eq!(buddy.free_block_count(), 0);
        assert_eq!(buddy.alloc(0), None);
        assert_eq!(buddy.alloc_block(PAGE), None);
        assert_eq!(
            buddy.free(0, 1),
            Err(BuddyError::OutOfRange {
                offset: 0,
                size: PAGE,
                capacity: 0
            })
        );
    }

    #[test]
    #[should_panic(expected = "power of two")]
    fn rejects_bad_min_block() {
        let _ = Buddy::new(1 << 20, 32);
    }

    #[test]
    fn rounded_sizes() {
        let buddy = Buddy::new(1 << 20, PAGE);
        for (size, rounded) in [
            (0, PAGE),
            (1, PAGE),
            (64, PAGE),
            (65, PAGE),
            (4095, PAGE),
            (4096, PAGE),
            (4097, 2 * PAGE),
            (3 * PAGE, 3 * PAGE),
            (u64::MAX, u64::MAX),
        ] {
            assert_eq!(buddy.rounded_size(size), rounded, "size {size}");
        }
    }

    #[test]
    fn small_sizes_take_one_page_lowest_address_first() {
        let mut buddy = Buddy::new(1 << 20, PAGE);
        let offsets: Vec<_> = [0, 1, 64, 65, 4095, 4096]
            .into_iter()
            .map(|size| buddy.alloc(size).unwrap())
            .collect();
        assert_eq!(offsets, (0..6).map(|i| i * PAGE).collect::<Vec<_>>());
        assert_eq!(buddy.used_bytes(), 6 * PAGE);
        check_invariants(&buddy);
    }

    #[test]
    fn exact_alloc_returns_the_tail() {
        let mut buddy = Buddy::new(1 << 20, PAGE);
        let a = buddy.alloc(4097).unwrap();
        assert_eq!(a, 0);
        assert_eq!(buddy.used_bytes(), 2 * PAGE);
        // 3 pages: aligned to 4 pages, the fourth page goes back to the free lists.
        let b = buddy.alloc(3 * PAGE).unwrap();
        assert_eq!(b, 4 * PAGE);
        assert_eq!(buddy.used_bytes(), 5 * PAGE);
        // The smallest free block is preferred: the returned tail page, then a split pair.
        assert_eq!(buddy.alloc(1), Some(7 * PAGE));
        assert_eq!(buddy.alloc(1), Some(2 * PAGE));
        assert_eq!(buddy.alloc(1), Some(3 * PAGE));
        check_invariants(&buddy);
        buddy.free(b, 3 * PAGE).unwrap();
        buddy.free(a, 4097).unwrap();
        for page in [2, 3, 7] {
            buddy.free(page * PAGE, 1).unwrap();
        }
        assert_eq!(free_blocks(&buddy), vec![(0, 1 << 20)]);
    }

    #[test]
    fn exactly_capacity_and_one_more() {
        let mut buddy = Buddy::new(1 << 20, PAGE);
        assert_eq!(buddy.alloc((1 << 20) + 1), None);
        assert_eq!(buddy.alloc(1 << 20), Some(0));
        assert_eq!(buddy.free_bytes(), 0);
        assert_eq!(buddy.largest_free_block(), 0);
        assert_eq!(buddy.alloc(1), None);
        buddy.free(0, 1 << 20).unwrap();
        assert_eq!(buddy.largest_free_block(), 1 << 20);

        // A non-power-of-two capacity has no block as large as itself.
        let mut odd = Buddy::new(12 * PAGE, PAGE);
        assert_eq!(odd.alloc(12 * PAGE), None);
        assert_eq!(odd.alloc(8 * PAGE), Some(0));
        assert_eq!(odd.alloc(4 * PAGE), Some(8 * PAGE));
        assert_eq!(odd.free_bytes(), 0);
    }

    #[test]
    fn huge_sizes_fail_cleanly() {
        let mut buddy = Buddy::new(u64::MAX, PAGE);
        assert_eq!(buddy.capacity(), u64::MAX - (PAGE - 1));
        assert_eq!(buddy.alloc(u64::MAX), None);
        assert_eq!(buddy.alloc((1 << 63) + 1), None);
        assert_eq!(buddy.alloc(1 << 63), Some(0));
        assert!(matches!(
            buddy.free(0, u64::MAX),
            Err(BuddyError::OutOfRange { .. })
        ));
        assert_eq!(
            buddy.free(0, (1 << 63) + 1),
            Err(BuddyError::InvalidSize {
                size: (1 << 63) + PAGE
            })
        );
        assert!(matches!(
            buddy.free(u64::MAX - PAGE + 1, 1),
            Err(BuddyError::OutOfRange { .. })
        ));
        buddy.free(0, 1 << 63).unwrap();
        check_invariants(&buddy);
    }

    #[test]
    fn alloc_block_is_naturally_aligned() {
        let mut buddy = Buddy::new(1 << 20, PAGE);
        assert_eq!(buddy.alloc_block(PAGE), Some(0));
        assert_eq!(buddy.alloc_block(64 * 1024), Some(64 * 1024));
        assert_eq!(buddy.alloc_block(2 * PAGE), Some(2 * PAGE));
        assert_eq!(buddy.alloc_block(2 << 20), None);
        buddy.free_block(2 * PAGE, 2 * PAGE).unwrap();
        buddy.free_block(0, PAGE).unwrap();
        buddy.free_block(64 * 1024, 64 * 1024).unwrap();
        assert_eq!(free_blocks(&buddy), vec![(0, 1 << 20)]);
    }

    #[test]
    fn free_rejects_invalid_regions_without_changing_state() {
        let mut buddy = Buddy::new(16 * PAGE, PAGE);
        let a = buddy.alloc(2 * PAGE).unwrap();
        let b = buddy.alloc(3 * PAGE).unwrap();
        assert_eq!((a, b), (0, 4 * PAGE));
        let before = free_blocks(&buddy);

        assert_eq!(
            buddy.free(16 * PAGE, 1),
            Err(BuddyError::OutOfRange {
                offset: 16 * PAGE,
                size: PAGE,
                capacity: 16 * PAGE
            })
        );
        assert!(matches!(
            buddy.free(15 * PAGE, 2 * PAGE),
            Err(BuddyError::OutOfRange { .. })
        ));
        assert_eq!(
            buddy.free(1, 1),
            Err(BuddyError::Misaligned {
                offset: 1,
                align: PAGE
            })
        );
        // Two pages must be two-page aligned.
        assert_eq!(
            buddy.free(PAGE, 2 * PAGE),
            Err(BuddyError::Misaligned {
                offset: PAGE,
                align: 2 * PAGE
            })
        );
        assert_eq!(
            buddy.free_block(0, 3 * PAGE),
            Err(BuddyError::InvalidSize { size: 3 * PAGE })
        );
        assert_eq!(
            buddy.free_block(0, 64),
            Err(BuddyError::InvalidSize { size: 64 })
        );
        // Too large a size reaches into the free tail of `b`, and into free memory after `a`.
        assert!(matches!(
            buddy.free(b, 4 * PAGE),
            Err(BuddyError::DoubleFree { .. })
        ));
        assert!(matches!(
            buddy.free(a, 4 * PAGE),
            Err(BuddyError::DoubleFree { .. })
        ));
        // Freeing inside a large free block.
        assert!(matches!(
            buddy.free(8 * PAGE, 1),
            Err(BuddyError::DoubleFree { .. })
        ));
        assert_eq!(free_blocks(&buddy), before);

        buddy.free(a, 2 * PAGE).unwrap();
        assert_eq!(
            buddy.free(a, 2 * PAGE),
            Err(BuddyError::DoubleFree {
                offset: a,
                size: 2 * PAGE
            })
        );
        // A region whose first page is free but the rest still allocated.
        assert!(matches!(
            buddy.free(0, 8 * PAGE),
            Err(BuddyError::DoubleFree { .. })
        ));
        buddy.free(b, 3 * PAGE).unwrap();
        assert!(matches!(
            buddy.free(b, 3 * PAGE),
            Err(BuddyError::DoubleFree { .. })
        ));
        assert_eq!(free_blocks(&buddy), vec![(0, 16 * PAGE)]);
        check_invariants(&buddy);
    }

    #[test]
    fn double_free_of_a_block_merged_into_a_larger_one() {
        let mut buddy = Buddy::new(8 * PAGE, PAGE);
        let a = buddy.alloc_block(PAGE).unwrap();
        let b = buddy.alloc_block(PAGE).unwrap();
        buddy.free_block(a, PAGE).unwrap();
        buddy.free_block(b, PAGE).unwrap();
        // `a` is now part of the single free 8-page block.
        assert_eq!(
            buddy.free_block(a, PAGE),
            Err(BuddyError::DoubleFree {
                offset: a,
                size: PAGE
            })
        );
    }

    #[test]
    fn errors_display() {
        let err = BuddyError::DoubleFree {
            offset: 0x1000,
            size: 0x2000,
        };
        assert_eq!(
            err.to_string(),
            "region 0x1000+0x2000 is already (partly) free"
        );
        let boxed: Box<dyn std::error::Error> = Box::new(err);
        assert!(!boxed.to_string().is_empty());
    }

    #[test]
    fn oom_then_recovery() {
        let mut buddy = Buddy::new(10 * PAGE, PAGE);
        let pages: Vec<_> = std::iter::from_fn(|| buddy.alloc(1)).collect();
        assert_eq!(pages.len(), 10);
        assert_eq!(buddy.alloc(1), None);
        assert_eq!(buddy.free_bytes(), 0);
        buddy.free(pages[3], 1).unwrap();
        assert_eq!(buddy.alloc(2 * PAGE), None);
        assert_eq!(buddy.alloc(1), Some(pages[3]));
        for &page in &pages {
            buddy.free(page, PAGE).unwrap();
        }
        assert_eq!(
            free_blocks(&buddy),
            vec![(0, 8 * PAGE), (8 * PAGE, 2 * PAGE)]
        );
        assert_eq!(buddy.alloc(8 * PAGE), Some(0));
        check_invariants(&buddy);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(u64),
        AllocBlock(u32),
        Free(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..=4 * PAGE).prop_map(Op::Alloc),
            1 => (0..=64 * PAGE).prop_map(Op::Alloc),
            1 => (0..8u32).prop_map(Op::AllocBlock),
            4 => any::<usize>().prop_map(Op::Free),
        ]
    }

    /// A live allocation in the shadow model.
    #[derive(Debug)]
    struct Live {
        offset: u64,
        /// Size passed to `alloc`, or the block size for `alloc_block`.
        size: u64,
        /// Bytes consumed.
        len: u64,
        block: bool,
    }

    fn check_against_model(buddy: &Buddy, live: &[Live]) {
        check_invariants(buddy);
        let mut spans: Vec<_> = live.iter().map(|l| (l.offset, l.len)).collect();
        spans.sort_unstable();
        for pair in spans.windows(2) {
            assert!(pair[0].0 + pair[0].1 <= pair[1].0, "overlap: {pair:?}");
        }
        assert_eq!(buddy.used_bytes(), live.iter().map(|l| l.len).sum::<u64>());
        // Free blocks never overlap live allocations.
        let free = free_blocks(buddy);
        for &(offset, len) in &spans {
            let i = free.partition_point(|&(f, _)| f < offset);
            if let Some(&(f, size)) = i.checked_sub(1).map(|i| &free[i]) {
                assert!(f + size <= offset, "free block {f:#x} covers {offset:#x}");
            }
            if let Some(&(f, _)) = free.get(i) {
                assert!(f >= offset + len, "free block {f:#x} inside {offset:#x}");
            }
        }
    }

    fn capacity() -> impl Strategy<Value = u64> {
        prop_oneof![
            (0..=8u32).prop_map(|shift| (16 * PAGE) << shift),
            (1..=300u64).prop_map(|pages| pages * PAGE),
            any::<u32>().prop_map(|bytes| u64::from(bytes) % (512 * PAGE)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn random_alloc_free_matches_model(
            capacity in capacity(),
            ops in prop::collection::vec(op(), 1..200),
        ) {
            let mut buddy = Buddy::new(capacity, PAGE);
            let initial = free_blocks(&buddy);
            let mut live: Vec<Live> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc(size) => {
                        let len = buddy.rounded_size(size);
                        let align = len.next_power_of_two();
                        let fits = align <= buddy.largest_free_block();
                        match buddy.alloc(size) {
                            Some(offset) => {
                                prop_assert!(fits);
                                prop_assert_eq!(offset % align, 0);
                                live.push(Live { offset, size, len, block: false });
                            }
                            None => prop_assert!(!fits),
                        }
                    }
                    Op::AllocBlock(order) => {
                        let size = PAGE << order;
                        let fits = size <= buddy.largest_free_block();
                        match buddy.alloc_block(size) {
                            Some(offset) => {
                                prop_assert!(fits);
                                prop_assert_eq!(offset % size, 0);
                                live.push(Live { offset, size, len: size, block: true });
                            }
                            None => prop_assert!(!fits),
                        }
                    }
                    Op::Free(index) if !live.is_empty() => {
                        let l = live.swap_remove(index % live.len());
                        if l.block {
                            buddy.free_block(l.offset, l.size).unwrap();
                        } else {
                            buddy.free(l.offset, l.size).unwrap();
                        }
                        // A second free of the same region is always rejected.
                        let again = buddy.free(l.offset, l.size);
                        prop_assert!(
                            matches!(again, Err(BuddyError::DoubleFree { .. })),
                            "second free gave {:?}",
                            again
                        );
                    }
                    Op::Free(_) => {}
                }
                check_against_model(&buddy, &live);
            }
            for l in live.drain(..) {
                buddy.free(l.offset, l.size).unwrap();
            }
            prop_assert_eq!(free_blocks(&buddy), initial);
            prop_assert_eq!(buddy.free_bytes(), buddy.capacity());
            if buddy.capacity().is_power_of_two() {
                prop_assert_eq!(buddy.largest_free_block(), buddy.capacity());
                prop_assert_eq!(buddy.free_block_count(), 1);
            }
        }
    }

    /// The caller's glue: small sizes go to the slab, whose spans come from the buddy; large
    /// sizes go to the buddy directly.
    mod with_slab {
        use super::super::super::slab::{self, Slab, SlabAlloc};
        use super::*;

        #[derive(Debug)]
        enum Held {
            Small { offset: u64, size: u64 },
            Large { offset: u64, size: u64 },
        }

        fn alloc_small(buddy: &mut Buddy, slab: &mut Slab, size: u64) -> Option<u64> {
            loop {
                match slab.alloc(size) {
                    SlabAlloc::Ok(offset) => return Some(offset),
                    SlabAlloc::NeedSpan { class, span_size } => {
                        match buddy.alloc_block(span_size) {
                            Some(span) => slab.add_span(class, span),
                            None => {
                                let (span, len) = slab.take_one_empty_span()?;
                                buddy.free_block(span, len).unwrap();
                            }
                        }
                    }
                }
            }
        }

        fn held_range(held: &Held) -> (u64, u64) {
            match *held {
                Held::Small { offset, size } => {
                    (offset, slab::class_size(slab::class_of(size).unwrap()))
                }
                Held::Large { offset, size } => (offset, size.next_multiple_of(PAGE)),
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn slab_on_buddy_returns_everything(
                pages in prop_oneof![Just(256u64), Just(1024u64), 64..=1200u64],
                ops in prop::collection::vec(
                    prop_oneof![
                        4 => (0..=slab::SLAB_MAX).prop_map(Some),
                        1 => (slab::SLAB_MAX + 1..=1 << 20).prop_map(Some),
                        3 => Just(None),
                    ],
                    1..200,
                ),
                picks in prop::collection::vec(any::<usize>(), 200),
            ) {
                let mut buddy = Buddy::new(pages * PAGE, PAGE);
                let initial = free_blocks(&buddy);
                let mut slab = Slab::new();
                let mut held: Vec<Held> = Vec::new();
                for (op, pick) in ops.into_iter().zip(picks) {
                    match op {
                        Some(size) if size <= slab::SLAB_MAX => {
                            if let Some(offset) = alloc_small(&mut buddy, &mut slab, size) {
                                held.push(Held::Small { offset, size });
                            }
                        }
                        Some(size) => {
                            if let Some(offset) = buddy.alloc(size) {
                                held.push(Held::Large { offset, size });
                            }
                        }
                        None if !held.is_empty() => {
                            match held.swap_remove(pick % held.len()) {
                                Held::Small { offset, size } => {
                                    slab.free(offset, size).unwrap();
                                }
                                Held::Large { offset, size } => buddy.free(offset, size).unwrap(),
                            }
                        }
                        None => {}
                    }
                    let mut ranges: Vec<_> = held.iter().map(held_range).collect();
                    ranges.sort_unstable();
                    for pair in ranges.windows(2) {
                        prop_assert!(pair[0].0 + pair[0].1 <= pair[1].0, "overlap {:?}", pair);
                    }
                    let large: u64 = held
                        .iter()
                        .filter(|h| matches!(h, Held::Large { .. }))
                        .map(|h| held_range(h).1)
                        .sum();
                    prop_assert_eq!(buddy.used_bytes(), slab.reserved_bytes() + large);
                    prop_assert_eq!(buddy.used_bytes() + buddy.free_bytes(), buddy.capacity());
                }
                for h in held.drain(..) {
                    match h {
                        Held::Small { offset, size } => {
                            slab.free(offset, size).unwrap();
                        }
                        Held::Large { offset, size } => buddy.free(offset, size).unwrap(),
                    }
                }
                for (span, len) in slab.take_empty_spans() {
                    buddy.free_block(span, len).unwrap();
                }
                prop_assert_eq!(slab.reserved_bytes(), 0);
                prop_assert_eq!(free_blocks(&buddy), initial);
                if pages.is_power_of_two() {
                    prop_assert_eq!(buddy.largest_free_block(), buddy.capacity());
                }
            }
        }
    }
}
