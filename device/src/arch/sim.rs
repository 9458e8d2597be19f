//! The simulator: outside the PTX build (any target but nvptx64) the [`arch`](super) operations
//! run on the CPU, one host thread per GPU thread, so that a test can run a kernel's own code
//! where no GPU is at hand (`strata-device-sim`, `tests/sim_*.rs`). It checks a kernel's logic:
//! its indices, barriers, shared-memory layout and reduction orders, bit for bit against the
//! replica. It says nothing of speed, of the code ptxas makes, or of races that need the
//! GPU's timing to show.
//!
//! - A block's threads are coroutines on the calling thread (`corosensei`), each running until
//!   it waits at a barrier, in turn; the blocks of a grid run one after another.
//! - Block and warp barriers wait for every thread that has not returned (a thread that has
//!   returned counts as arrived, as on the GPU). A shuffle is a store to the warp's exchange
//!   slots between two warp barriers. Threads that wait at barriers which can never release
//!   (a barrier some threads of a block skip) end the launch with an error.
//! - Shared memory is the block's own buffer, filled with 0xff bytes (a NaN as f32) before the
//!   block starts, and every access is checked against the launch's size. `cp.async` copies at
//!   once (so its waits have nothing to wait for).
//! - Global memory is the host memory the test's pointers point at: every access is checked to
//!   lie inside one of the launch's [`Region`]s (a store, inside a writable one) and aligned to
//!   its size. Prefetches and grid chaining do nothing.
//! - A trap, an access out of bounds or misaligned, or an integer overflow the test build checks
//!   ends the launch with an error naming the block, the thread and the cause.
use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Each simulated thread's stack (the kernels' frames are small; the test build's are larger).
const STACK_BYTES: usize = 1 << 20;

/// A barrier of a block's threads, or a warp's lanes, that a member leaves when it returns.
/// Every thread of a block runs on one host thread, so plain cells suffice.
struct Barrier {
    members: Cell<u32>,
    arrived: Cell<u32>,
    generation: Cell<u64>,
}

impl Barrier {
    fn new(members: u32) -> Self {
        Barrier { members: Cell::new(members), arrived: Cell::new(0), generation: Cell::new(0) }
    }

    /// Releases the waiting members once every member still running has arrived.
    fn release_if_all(&self) {
        if self.arrived.get() > 0 && self.arrived.get() == self.members.get() {
            self.arrived.set(0);
            self.generation.set(self.generation.get() + 1);
        }
    }

    fn wait(&self) {
        let generation = self.generation.get();
        self.arrived.set(self.arrived.get() + 1);
        self.release_if_all();
        while self.generation.get() == generation {
            suspend();
        }
    }

    fn leave(&self) {
        self.members.set(self.members.get() - 1);
        self.release_if_all();
    }
}

struct Warp {
    barrier: Barrier,
    slots: [Cell<u32>; 32],
}

/// Host memory a launch may access: `bytes` bytes from `start`, stored to only if `writable`.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    pub start: usize,
    pub bytes: usize,
    pub writable: bool,
}

impl Region {
    /// The region of `s`'s elements; `writable` where the kernel may store to them.
    pub fn of<T>(s: &[T], writable: bool) -> Region {
        Region { start: s.as_ptr() as usize, bytes: std::mem::size_of_val(s), writable }
    }
}

/// What a simulated thread knows of itself and its block (the thread-local of the coroutine
/// running now, set before each resume).
#[derive(Clone, Copy)]
struct Thread {
    thread: u32,
    block: u32,
    block_dim: u32,
    smem: *mut u8,
    smem_bytes: usize,
    barrier: *const Barrier,
    warp: *const Warp,
    memory: *const [Region],
    yielder: *const Yielder<(), ()>,
}

thread_local! {
    static THREAD: Cell<Option<Thread>> = const { Cell::new(None) };
    /// Stacks of coroutines that ended, for the next blocks (mapping one costs more than a
    /// short kernel's run).
    static STACKS: std::cell::RefCell<Vec<DefaultStack>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn me() -> Thread {
    THREAD.with(|t| t.get()).expect("a device operation outside a simulated launch (strata_device::arch::sim::launch)")
}

pub fn thread_idx() -> u32 {
    me().thread
}

pub fn block_idx() -> u32 {
    me().block
}

pub fn block_dim() -> u32 {
    me().block_dim
}

/// Hands the host thread to the block's next coroutine until the scheduler resumes this one.
fn suspend() {
    let t = me();
    // SAFETY: the yielder is this coroutine's, which is running (it called this).
    unsafe { (*t.yielder).suspend(()) };
    THREAD.with(|c| c.set(Some(t)));
}

pub fn sync_threads() {
    // SAFETY: the block's state outlives its coroutines (`run_block` drops them first).
    unsafe { (*me().barrier).wait() }
}

pub fn sync_warp() {
    // SAFETY: as `sync_threads`.
    unsafe { (*me().warp).barrier.wait() }
}

/// Lane `src`'s `v`, every lane of the warp taking part.
pub fn shfl(v: u32, src: u32) -> u32 {
    let t = me();
    // SAFETY: as `sync_threads`.
    let warp = unsafe { &*t.warp };
    warp.slots[(t.thread % 32) as usize].set(v);
    warp.barrier.wait();
    let r = warp.slots[(src % 32) as usize].get();
    warp.barrier.wait(); // no lane stores its next value before every lane has read this one
    r
}

/// The host address of `bytes` bytes at byte `at` of the block's shared memory, aligned to
/// `bytes`; a failure of the launch where they are not inside it.
pub fn smem(at: u64, bytes: usize) -> *mut u8 {
    let t = me();
    assert!(at % bytes as u64 == 0, "misaligned {bytes}-byte shared-memory access at byte {at}");
    assert!(at + bytes as u64 <= t.smem_bytes as u64, "shared-memory access at bytes {at}..{} past the launch's {}", at + bytes as u64, t.smem_bytes);
    // SAFETY: inside the block's buffer (checked above).
    unsafe { t.smem.add(at as usize) }
}

/// `p`, checked for a global load (`store`: a store) of `bytes` bytes.
pub fn global<T>(p: *const T, bytes: usize, store: bool) -> *const T {
    assert!(p as usize % bytes == 0, "misaligned {bytes}-byte global access at {p:p}");
    // SAFETY: the regions outlive the launch's coroutines (`run_block` drops them first).
    let memory = unsafe { &*me().memory };
    let at = p as usize;
    match memory.iter().find(|r| at >= r.start && at + bytes <= r.start + r.bytes) {
        Some(r) if store && !r.writable => panic!("a {bytes}-byte store at {p:p}, into a read-only buffer ({} bytes at {:#x})", r.bytes, r.start),
        Some(_) => p,
        None => panic!("a {bytes}-byte global {} at {p:p}, outside every buffer of the launch", if store { "store" } else { "load" }),
    }
}

/// Loads `T` from `p` (global or shared, after the checks above).
///
/// # Safety
/// `p` points at a `T` the test allocated, or into the block's shared memory.
pub unsafe fn load<T: Copy>(p: *const T) -> T {
    core::ptr::read_volatile(p)
}

/// Stores `v` at `p`.
///
/// # Safety
/// As [`load`].
pub unsafe fn store<T: Copy>(p: *mut T, v: T) {
    core::ptr::write_volatile(p, v)
}

pub fn trap() -> ! {
    panic!("the kernel trapped")
}

/// Runs `kernel` as a launch of `grid` blocks of `threads` threads with `smem_bytes` bytes of
/// dynamic shared memory and the global `memory` given: every [`arch`](super) operation
/// `kernel` calls acts for its thread. `Err` names the first thread that failed (a trap, a
/// failed check above, an overflow) and why.
pub fn launch(grid: u32, threads: u32, smem_bytes: usize, memory: &[Region], kernel: impl Fn() + Sync) -> Result<(), String> {
    for block in 0..grid {
        run_block(block, threads, smem_bytes, memory, &kernel)?;
    }
    Ok(())
}

fn run_block(block: u32, threads: u32, smem_bytes: usize, memory: &[Region], kernel: &(impl Fn() + Sync)) -> Result<(), String> {
    // 16-byte words, so the buffer is aligned as the GPU's shared window is.
    let mut smem = vec![u128::MAX; smem_bytes.div_ceil(16)];
    let barrier = Barrier::new(threads);
    let warps: Vec<Warp> = (0..threads.div_ceil(32))
        .map(|w| Warp { barrier: Barrier::new((threads - 32 * w).min(32)), slots: Default::default() })
        .collect();
    let mut me: Vec<Thread> = (0..threads)
        .map(|thread| Thread {
            thread,
            block,
            block_dim: threads,
            smem: smem.as_mut_ptr() as *mut u8,
            smem_bytes,
            barrier: &barrier,
            warp: &warps[(thread / 32) as usize],
            memory,
            yielder: std::ptr::null(),
        })
        .collect();
    let mut coroutines = Vec::with_capacity(threads as usize);
    for _ in 0..threads {
        let stack = match STACKS.with(|s| s.borrow_mut().pop()) {
            Some(stack) => stack,
            None => DefaultStack::new(STACK_BYTES).map_err(|e| format!("a simulated thread's stack: {e}"))?,
        };
        // SAFETY: the coroutines borrow `kernel` and nothing else; each is run to its end or
        // dropped below, before this function returns.
        coroutines.push(Some(unsafe {
            Coroutine::with_stack_unchecked(stack, |yielder: &Yielder<(), ()>, ()| {
                THREAD.with(|c| c.set(c.get().map(|t| Thread { yielder, ..t })));
                kernel();
            })
        }));
    }
    // Round after round, each thread runs to its next barrier or its end. A round in which no
    // barrier released and no thread ended is a deadlock.
    let releases = || barrier.generation.get() + warps.iter().map(|w| w.barrier.generation.get()).sum::<u64>();
    let mut running = threads;
    while running > 0 {
        let before = (releases(), running);
        for (t, slot) in coroutines.iter_mut().enumerate() {
            let Some(co) = slot else { continue };
            THREAD.with(|c| c.set(Some(me[t])));
            let ran = catch_unwind(AssertUnwindSafe(|| co.resume(())));
            me[t] = THREAD.with(|c| c.take()).unwrap_or(me[t]);
            match ran {
                Ok(CoroutineResult::Yield(())) => {}
                Ok(CoroutineResult::Return(())) => {
                    if let Some(co) = slot.take() {
                        STACKS.with(|s| s.borrow_mut().push(co.into_stack()));
                    }
                    running -= 1;
                    warps[t / 32].barrier.leave();
                    barrier.leave();
                }
                Err(cause) => {
                    let why = cause.downcast_ref::<String>().cloned().or_else(|| cause.downcast_ref::<&str>().map(|s| s.to_string()));
                    return Err(format!("block {block}, thread {t}: {}", why.unwrap_or_else(|| "a panic".into())));
                }
            }
        }
        if (releases(), running) == before {
            let waiting: Vec<usize> = coroutines.iter().enumerate().filter(|(_, c)| c.is_some()).map(|(t, _)| t).collect();
            return Err(format!("block {block}: threads {:?}.. wait at barriers that cannot release (a barrier some of the block's threads skip)", &waiting[..waiting.len().min(8)]));
        }
    }
    Ok(())
}
