//! The simulator: outside the PTX build (any target but nvptx64) the [`arch`](super) operations
//! run on the CPU, so that a test can run a kernel's own code where no GPU is at hand (the
//! `strata-device-sim` package; the host's `sim` backend; docs/simulator.md). It checks a
//! kernel's logic: its indices, barriers, shared-memory layout and reduction orders, bit for bit
//! against the replica. It says nothing of speed, of the code ptxas makes, or of races that need
//! the GPU's timing to show.
//!
//! - A block's threads are coroutines on the calling thread (`corosensei`), each running until
//!   it waits at a barrier, in turn; the blocks of a grid run one after another.
//! - Block and warp barriers wait for every thread that has not returned (a thread that has
//!   returned counts as arrived, as on the GPU). A shuffle is a store to the warp's exchange
//!   slots, a warp barrier, and a load. Threads that wait at barriers which can never release
//!   (a barrier some threads of a block skip) end the launch with an error.
//! - Shared memory is the block's own buffer, filled with 0xff bytes (a NaN as f32) before the
//!   block starts, and every access is checked against the launch's size. A `cp.async` copy
//!   lands only when its thread waits for it (its group, or all), so a read before the wait
//!   sees what was there before.
//! - Global memory is the host memory the test's pointers point at: every access through
//!   `arch::mem` is checked to lie inside one of the launch's [`Region`]s (a store, inside a
//!   writable one) and aligned to its size. Prefetches and grid chaining do nothing.
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
    /// A shuffle's values with the barrier generation they were written for, in the set of that
    /// generation's parity: a lane writes the set of a later shuffle only after the barrier
    /// between (every lane has read this one). A slot of another generation is a lane that did
    /// not take part (it returned), which on the GPU is undefined.
    slots: [[Cell<(u32, u64)>; 32]; 2],
}

/// A kernel entry the simulator can launch by name (every `crate::entry!` adds its own).
pub struct Entry {
    pub name: &'static str,
    /// The parameters' names, in order.
    pub params: &'static [&'static str],
    /// Calls the entry with `args` (one a parameter, in order, of its type: a launch's argument
    /// list, as the cuda backend pushes it); a missing or mistyped argument fails the launch.
    ///
    /// # Safety
    /// The entry's: its pointers are buffers of the sizes it names (and inside the launch's
    /// regions, which the simulator checks only for the accesses made through `arch::mem`).
    pub call: unsafe fn(&[Arg]),
}

/// Every entry of the kernels.
#[linkme::distributed_slice]
pub static ENTRIES: [Entry];

/// The entry `name`.
pub fn entry(name: &str) -> Option<&'static Entry> {
    ENTRIES.iter().find(|e| e.name == name)
}

/// One argument of a launch.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// A buffer's address (or 0: a null pointer).
    Ptr(usize),
    U32(u32),
    U64(u64),
    I32(i32),
    F32(f32),
}

/// A parameter's value from its [`Arg`].
pub trait FromArg: Sized {
    fn from_arg(a: Arg) -> Option<Self>;

    /// The next argument of `entry`'s list as this parameter; a failure of the launch where it
    /// is missing or of another kind.
    fn take<'a>(args: &mut impl Iterator<Item = (usize, &'a Arg)>, entry: &str) -> Self {
        match args.next() {
            Some((i, a)) => Self::from_arg(*a).unwrap_or_else(|| panic!("{entry}: argument {i} is {a:?}, not a {}", std::any::type_name::<Self>())),
            None => panic!("{entry}: too few arguments"),
        }
    }
}

impl<T> FromArg for *const T {
    fn from_arg(a: Arg) -> Option<Self> {
        if let Arg::Ptr(p) = a { Some(p as *const T) } else { None }
    }
}

impl<T> FromArg for *mut T {
    fn from_arg(a: Arg) -> Option<Self> {
        if let Arg::Ptr(p) = a { Some(p as *mut T) } else { None }
    }
}

/// `FromArg` for each scalar type and its [`Arg`] variant.
macro_rules! scalar_args {
    ($($t:ty => $v:ident),*) => {$(
        impl FromArg for $t {
            fn from_arg(a: Arg) -> Option<Self> {
                if let Arg::$v(v) = a { Some(v) } else { None }
            }
        }
    )*};
}
scalar_args!(u32 => U32, u64 => U64, i32 => I32, f32 => F32);

/// Host memory a launch may access: `bytes` bytes from `start`, stored to only if `writable`.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    start: usize,
    bytes: usize,
    writable: bool,
}

impl Region {
    /// The region of `s`'s elements; `writable` where the kernel may store to them.
    pub fn of<T>(s: &[T], writable: bool) -> Region {
        Region { start: s.as_ptr() as usize, bytes: std::mem::size_of_val(s), writable }
    }
}

/// What a simulated thread knows of itself and its block (the thread-local points at the
/// running coroutine's, set before each resume).
struct Thread {
    thread: u32,
    block: u32,
    block_dim: u32,
    smem: *mut u8,
    smem_bytes: usize,
    barrier: *const Barrier,
    warp: *const Warp,
    memory: *const [Region],
    /// The region of the thread's last global access (where the next is likely).
    last_region: Cell<usize>,
    yielder: Cell<*const Yielder<(), ()>>,
    /// The thread's `cp.async` copies not yet waited for: committed groups (oldest first), then
    /// those since the last commit.
    copies: *const std::cell::RefCell<Copies>,
    /// The block's shared words a copy in flight will write (a count a word).
    pending: *const [Cell<u8>],
}

/// A thread's copies in flight: `(to, from, bytes)`.
#[derive(Default)]
struct Copies {
    committed: std::collections::VecDeque<Vec<(*mut u8, *const u8, usize)>>,
    open: Vec<(*mut u8, *const u8, usize)>,
}

thread_local! {
    static THREAD: Cell<*const Thread> = const { Cell::new(std::ptr::null()) };
    /// Stacks of coroutines that ended, for the next blocks (mapping one costs more than a
    /// short kernel's run).
    static STACKS: std::cell::RefCell<Vec<DefaultStack>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn me() -> &'static Thread {
    let t = THREAD.with(|t| t.get());
    assert!(!t.is_null(), "a device operation outside a simulated launch (strata_device::arch::sim::launch)");
    // SAFETY: set by `run_block` to the running coroutine's record, which outlives the
    // coroutine's run (the `'static` never leaves this module's functions).
    unsafe { &*t }
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
    // SAFETY: the yielder is this coroutine's, which is running (it called this).
    unsafe { (*me().yielder.get()).suspend(()) };
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
    let generation = warp.barrier.generation.get();
    let set = &warp.slots[(generation % 2) as usize];
    set[(t.thread % 32) as usize].set((v, generation));
    warp.barrier.wait();
    let (r, written) = set[(src % 32) as usize].get();
    assert!(written == generation, "a shuffle reads lane {}, which has returned", src % 32);
    r
}

/// The host address of `bytes` bytes at byte `at` of the block's shared memory, aligned to
/// `bytes`; a failure of the launch where they are not inside it.
pub fn smem(at: u64, bytes: usize) -> *mut u8 {
    let t = me();
    assert!(at % bytes as u64 == 0, "misaligned {bytes}-byte shared-memory access at byte {at}");
    assert!(at + bytes as u64 <= t.smem_bytes as u64, "shared-memory access at bytes {at}..{} past the launch's {}", at + bytes as u64, t.smem_bytes);
    // SAFETY: the block's map, alive as long as its coroutines.
    let pending = unsafe { &*t.pending };
    let words = at as usize / 4..(at as usize + bytes).div_ceil(4);
    assert!(pending[words].iter().all(|w| w.get() == 0), "shared-memory access at bytes {at}..{} while a cp.async copy into them is in flight (not waited for)", at + bytes as u64);
    // SAFETY: inside the block's buffer (checked above).
    unsafe { t.smem.add(at as usize) }
}

/// `p`, checked for a global load (`store`: a store) of `bytes` bytes.
pub fn global<T>(p: *const T, bytes: usize, store: bool) -> *const T {
    assert!(p as usize % bytes == 0, "misaligned {bytes}-byte global access at {p:p}");
    // SAFETY: the regions outlive the launch's coroutines (`run_block` drops them first).
    let (t, at) = (me(), p as usize);
    let memory = unsafe { &*t.memory };
    let inside = |r: &Region| at >= r.start && at + bytes <= r.start + r.bytes;
    let last = t.last_region.get();
    let found = if memory.get(last).is_some_and(inside) { Some(last) } else { memory.iter().position(inside) };
    if let Some(i) = found {
        t.last_region.set(i);
    }
    match found.map(|i| &memory[i]) {
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

/// Starts a `cp.async` of `bytes` bytes from global `src` to shared address `dst` (both checked
/// now); it lands when the thread waits for it, and until then any access to its destination
/// fails the launch.
///
/// # Safety
/// The launch's regions are the test's live buffers (what `launch`'s caller promises).
pub unsafe fn cp_async(dst: u32, src: *const u8, bytes: usize) {
    let (to, from) = (smem(dst as u64, bytes), global(src, bytes, false));
    let t = me();
    (*t.copies).borrow_mut().open.push((to, from, bytes));
    mark_pending(t, dst as usize, bytes, true);
}

/// Counts the shared words of a copy in flight (`on`), or uncounts them as it lands.
fn mark_pending(t: &Thread, at: usize, bytes: usize, on: bool) {
    // SAFETY: the block's map, alive as long as its coroutines.
    let pending = unsafe { &*t.pending };
    for w in &pending[at / 4..(at + bytes).div_ceil(4)] {
        w.set(if on { w.get() + 1 } else { w.get() - 1 });
    }
}

/// Closes the thread's open copies into a group.
pub fn cp_async_commit() {
    // SAFETY: the thread's own queue, alive as long as its block.
    let mut c = unsafe { (*me().copies).borrow_mut() };
    let open = std::mem::take(&mut c.open);
    c.committed.push_back(open);
}

/// Lands every copy of the thread but the newest `pending` committed groups (`all`: and the
/// open ones, as `cp.async.wait_all`).
pub fn cp_async_wait(pending: usize, all: bool) {
    let t = me();
    // SAFETY: as `cp_async_commit`.
    let mut c = unsafe { (*t.copies).borrow_mut() };
    let mut landing = Vec::new();
    while c.committed.len() > if all { 0 } else { pending } {
        landing.extend(c.committed.pop_front().into_iter().flatten());
    }
    if all {
        landing.append(&mut c.open);
    }
    let base = t.smem as usize;
    for (to, from, bytes) in landing {
        mark_pending(t, to as usize - base, bytes, false);
        // SAFETY: both ends checked when the copy started (`cp_async`'s contract: the regions
        // are live buffers), the destination inside the block's shared memory.
        unsafe { core::ptr::copy_nonoverlapping(from, to, bytes) };
    }
}

pub fn trap() -> ! {
    panic!("the kernel trapped")
}

/// Runs `kernel` as a launch of `grid` blocks of `threads` threads with `smem_bytes` bytes of
/// dynamic shared memory and the global `memory` given: every [`arch`](super) operation
/// `kernel` calls acts for its thread. `Err` names the first thread that failed (a trap, a
/// failed check above, an overflow) and why.
pub fn launch(grid: u32, threads: u32, smem_bytes: usize, memory: &[Region], kernel: impl Fn()) -> Result<(), String> {
    for block in 0..grid {
        run_block(block, threads, smem_bytes, memory, &kernel)?;
    }
    Ok(())
}

fn run_block(block: u32, threads: u32, smem_bytes: usize, memory: &[Region], kernel: &impl Fn()) -> Result<(), String> {
    // 16-byte words, so the buffer is aligned as the GPU's shared window is.
    let mut smem = vec![u128::MAX; smem_bytes.div_ceil(16)];
    let barrier = Barrier::new(threads);
    let warps: Vec<Warp> = (0..threads.div_ceil(32))
        .map(|w| Warp { barrier: Barrier::new((threads - 32 * w).min(32)), slots: std::array::from_fn(|_| std::array::from_fn(|_| Cell::new((0, u64::MAX)))) })
        .collect();
    let copies: Vec<std::cell::RefCell<Copies>> = (0..threads).map(|_| Default::default()).collect();
    let pending: Vec<Cell<u8>> = (0..smem_bytes.div_ceil(4)).map(|_| Cell::new(0)).collect();
    let records: Vec<Thread> = (0..threads)
        .map(|thread| Thread {
            thread,
            block,
            block_dim: threads,
            smem: smem.as_mut_ptr() as *mut u8,
            smem_bytes,
            barrier: &barrier,
            warp: &warps[(thread / 32) as usize],
            memory,
            last_region: Cell::new(0),
            yielder: Cell::new(std::ptr::null()),
            copies: &copies[thread as usize],
            pending: pending.as_slice(),
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
                me().yielder.set(yielder);
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
        // Odd blocks take their threads in reverse order: between two barriers a thread that
        // reads what a later one writes (a missing barrier) then sees it unwritten in one order.
        for i in 0..threads as usize {
            let t = if block % 2 == 1 { threads as usize - 1 - i } else { i };
            let slot = &mut coroutines[t];
            let Some(co) = slot else { continue };
            THREAD.with(|c| c.set(&records[t]));
            let ran = catch_unwind(AssertUnwindSafe(|| co.resume(())));
            THREAD.with(|c| c.set(std::ptr::null()));
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
