//! The timeline build of the kernels (`strata bench decode --timeline`): the module's PTX with
//! every entry made to stamp, from the first thread of each block, the global nanosecond timer
//! (`%globaltimer`) when the block starts, when its wait for the previous grid returns, and when
//! it returns, into a table in device memory. The host lays a step's launches out in time from
//! the table: how long each grid ran from its release to its last block's end, and the gap
//! between one grid's last block and the next grid's release (the chain's handoff), which a
//! profiler, timing launches one at a time, cannot show inside a replayed graph.
//!
//! The stamps are reductions (`red.global.min` / `max` / `add`), which a thread posts and does
//! not wait for, and no register lives from one stamp to the next (each recomputes its record's
//! address), so the instrumented kernels keep their register budgets. A launch's records are
//! found by `%gridid` (the driver's number of the launch in its context) modulo [`SLOTS`]; each
//! launch has [`LANES`] records, a block stamping the one of its index modulo `LANES`, so that a
//! grid of a thousand blocks does not queue its atomics on one address.
//!
//! The default images are untouched: the instrumentation is a text pass over their PTX, made at
//! run time when a timeline is asked for.
use std::fmt::Write as _;

/// The table's symbol in the instrumented module.
pub const SYMBOL: &str = "strata_trace";
/// Launches the table tells apart (`%gridid` modulo this): more than two one-token steps.
pub const SLOTS: usize = 2048;
/// Records a launch: block `b` stamps record `b % LANES`.
pub const LANES: usize = 32;
/// Bytes of a record: its own 128-byte line.
pub const RECORD: usize = 128;
/// Bytes of the table.
pub const TABLE_BYTES: usize = SLOTS * LANES * RECORD;
// (A record's offset is computed in 32 bits.)
const _: () = assert!(TABLE_BYTES <= u32::MAX as usize);

// A record's fields (byte offsets): the launch's `%gridid` and entry index (stored by every
// block's first stamp), then the reductions over the blocks that stamp the record. The sums of
// the release and end times wrap (mod 2^64); their difference is still the exact sum of the
// blocks' runs.
const GRIDID: usize = 0;
const FIRST_START: usize = 8;
const FIRST_RELEASE: usize = 16;
const LAST_RELEASE: usize = 24;
const LAST_END: usize = 32;
const BLOCKS: usize = 40;
const ENTRY: usize = 44;
const SUM_RELEASE: usize = 48;
const SUM_END: usize = 56;
const RELEASES: usize = 64;
// Mark `n` (1..=MARKS) of the kernel (`trace_mark!`): the sum of its blocks' times there, and
// how many passed it.
const MARK_SUM: usize = 72;
const MARK_COUNT: usize = 104;
const _: () = assert!(MARK_SUM + 8 * MARKS <= MARK_COUNT && MARK_COUNT + 4 * MARKS <= RECORD);

/// Marks a kernel may have (`trace_mark!` in `device/src/arch/trace.rs`, 1 to this).
pub const MARKS: usize = 4;
/// The comment a `trace_mark!` leaves in the PTX, before its number and name.
const MARK: &str = "// strata-trace-mark ";

/// The instrumented PTX and its entries in module order (a record's entry index names one).
#[derive(Debug)]
pub struct Instrumented {
    pub ptx: String,
    pub entries: Vec<Entry>,
}

/// An entry of the instrumented module: its name and its marks' (`marks[n - 1]` for mark `n`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub marks: [Option<String>; MARKS],
}

/// Where in an entry a stamp goes.
#[derive(Clone, Copy)]
enum Point {
    /// Before the entry's first instruction: the launch's gridid, its entry index, the block's start.
    Start(usize),
    /// After each `griddepcontrol.wait` (and the `launch_dependents` right after it, which the
    /// stamp would otherwise delay): the previous grid has completed.
    Release,
    /// Before each `ret`.
    End,
    /// At a `trace_mark!` of the kernel: mark `n`.
    Mark(usize),
}

/// The PTX of one stamp: thread 0 of the block only; `label` unique in the module.
fn stamp(point: Point, label: usize) -> String {
    let mut s = String::new();
    let mut line = |l: &str| {
        s.push('\t');
        s.push_str(l);
        s.push('\n');
    };
    line("mov.u32 \t%trace_r0, %tid.x;");
    line("setp.ne.u32 \t%trace_p0, %trace_r0, 0;");
    line(&format!("@%trace_p0 bra \t$L__trace_{label};"));
    // The record's offset in 32 bits (the table is 8 MiB), then its address.
    line("mov.u64 \t%trace_d0, %gridid;");
    line("cvt.u32.u64 \t%trace_r0, %trace_d0;");
    line(&format!("and.b32 \t%trace_r0, %trace_r0, {};", SLOTS - 1));
    line("mov.u32 \t%trace_r1, %ctaid.x;");
    line(&format!("and.b32 \t%trace_r1, %trace_r1, {};", LANES - 1));
    line(&format!("mad.lo.u32 \t%trace_r0, %trace_r0, {LANES}, %trace_r1;"));
    line(&format!("mul.lo.u32 \t%trace_r0, %trace_r0, {RECORD};"));
    line(&format!("mov.u64 \t%trace_d1, {SYMBOL};"));
    line("mad.wide.u32 \t%trace_d1, %trace_r0, 1, %trace_d1;");
    line("mov.u64 \t%trace_d2, %globaltimer;");
    match point {
        Point::Start(entry) => {
            line(&format!("st.global.u64 \t[%trace_d1+{GRIDID}], %trace_d0;"));
            line(&format!("st.global.u32 \t[%trace_d1+{ENTRY}], {entry};"));
            line(&format!("red.global.min.u64 \t[%trace_d1+{FIRST_START}], %trace_d2;"));
        }
        Point::Release => {
            line(&format!("red.global.min.u64 \t[%trace_d1+{FIRST_RELEASE}], %trace_d2;"));
            line(&format!("red.global.max.u64 \t[%trace_d1+{LAST_RELEASE}], %trace_d2;"));
            line(&format!("red.global.add.u64 \t[%trace_d1+{SUM_RELEASE}], %trace_d2;"));
            line(&format!("red.global.add.u32 \t[%trace_d1+{RELEASES}], 1;"));
        }
        Point::Mark(n) => {
            line(&format!("red.global.add.u64 \t[%trace_d1+{}], %trace_d2;", MARK_SUM + 8 * (n - 1)));
            line(&format!("red.global.add.u32 \t[%trace_d1+{}], 1;", MARK_COUNT + 4 * (n - 1)));
        }
        Point::End => {
            line(&format!("red.global.max.u64 \t[%trace_d1+{LAST_END}], %trace_d2;"));
            line(&format!("red.global.add.u64 \t[%trace_d1+{SUM_END}], %trace_d2;"));
            line(&format!("red.global.add.u32 \t[%trace_d1+{BLOCKS}], 1;"));
        }
    }
    let _ = writeln!(s, "$L__trace_{label}:");
    s
}

/// Whether a trimmed line returns from its function in a form other than a plain `ret;`.
fn other_return(t: &str) -> bool {
    let instr = match t.strip_prefix('@') {
        Some(rest) => rest.split_once(char::is_whitespace).map_or("", |(_, i)| i.trim_start()),
        None => t,
    };
    t != "ret;" && (instr == "ret;" || instr.starts_with("ret.") || instr.starts_with("ret "))
}

/// Mark `n` and its name from a mark's comment (`t` trimmed, after [`MARK`]).
fn parse_mark(rest: &str) -> Option<(usize, &str)> {
    let (n, name) = rest.split_once(' ')?;
    let n: usize = n.parse().ok().filter(|n| (1..=MARKS).contains(n))?;
    let name = name.trim();
    (!name.is_empty()).then_some((n, name))
}

/// `ptx` (an image as build.rs leaves it) with every entry stamping the table [`SYMBOL`], and
/// each `trace_mark!` of an entry a stamp of its own. Refused where the text is not as LLVM
/// writes it: no `.address_size` line, an entry without a body or without a `ret`, a predicated
/// or `.uni` return (whose stamp would need the predicate); a symbol of the table's name
/// already there; a mark outside an entry, numbered outside 1..=`MARKS`, without a name, or
/// named two ways in one entry.
pub fn instrument(ptx: &str) -> Result<Instrumented, String> {
    if ptx.contains(SYMBOL) {
        return Err(format!("the PTX already has a symbol `{SYMBOL}`"));
    }
    let mut out = String::with_capacity(ptx.len() + ptx.len() / 8);
    let mut entries: Vec<Entry> = Vec::new();
    // The entry whose header or body the pass is in; whether its body has begun, its start
    // stamped, and how many `ret`s it had.
    let mut entry: Option<usize> = None;
    let (mut in_body, mut started, mut rets) = (false, false, 0usize);
    let mut labels = 0usize;
    let (mut declared, mut release_due) = (false, false);
    let close = |name: Option<&String>, rets: usize| match (name, rets) {
        (Some(n), 0) => Err(format!("entry `{n}` has no `ret;` to stamp")),
        _ => Ok(()),
    };
    for line in ptx.lines() {
        let t = line.trim();
        if release_due {
            release_due = false;
            if t == "griddepcontrol.launch_dependents;" {
                out.push_str(line);
                out.push('\n');
                out.push_str(&stamp(Point::Release, labels));
                labels += 1;
                continue;
            }
            out.push_str(&stamp(Point::Release, labels));
            labels += 1;
        }
        if let Some(rest) = t.strip_prefix(".visible .entry ") {
            if entry.is_some() && !in_body {
                return Err(format!("entry `{}` has no body", entries.last().map_or("", |e| e.name.as_str())));
            }
            entries.push(Entry { name: rest.split('(').next().unwrap_or("").trim().to_string(), marks: Default::default() });
            entry = Some(entries.len() - 1);
            (in_body, started, rets) = (false, false, 0);
        }
        if entry.is_some() && !in_body && line == "{" {
            out.push_str("{\n\t.reg .pred \t%trace_p<1>;\n\t.reg .b32 \t%trace_r<2>;\n\t.reg .b64 \t%trace_d<3>;\n");
            in_body = true;
            continue;
        }
        let declaration = t.is_empty() || t.starts_with(".reg") || t.starts_with(".local") || t.starts_with(".shared");
        if let (Some(e), true, false, false) = (entry, in_body, started, declaration) {
            out.push_str(&stamp(Point::Start(e), labels));
            labels += 1;
            started = true;
        }
        if in_body {
            if line == "}" {
                close(entry.map(|e| &entries[e].name), rets)?;
                (entry, in_body) = (None, false);
            } else if t == "ret;" {
                out.push_str(&stamp(Point::End, labels));
                labels += 1;
                rets += 1;
            } else if other_return(t) {
                return Err(format!("entry `{}` returns with `{t}`, which the timeline does not stamp", entries[entry.unwrap_or(0)].name));
            }
        }
        out.push_str(line);
        out.push('\n');
        if let Some(rest) = t.strip_prefix(MARK) {
            let (Some(e), true) = (entry, in_body) else { return Err(format!("`{t}` outside an entry's body")) };
            let entry = &mut entries[e];
            let (n, name) = parse_mark(rest).ok_or_else(|| format!("entry `{}`: `{t}` is not a mark 1..={MARKS} with a name", entry.name))?;
            match &entry.marks[n - 1] {
                Some(had) if had != name => return Err(format!("entry `{}`: mark {n} is named `{had}` and `{name}`", entry.name)),
                _ => entry.marks[n - 1] = Some(name.to_string()),
            }
            out.push_str(&stamp(Point::Mark(n), labels));
            labels += 1;
        }
        release_due = in_body && t == "griddepcontrol.wait;";
        if !declared && t.starts_with(".address_size") {
            let _ = writeln!(out, ".visible .global .align 8 .b8 {SYMBOL}[{TABLE_BYTES}];");
            declared = true;
        }
    }
    if entry.is_some() {
        return Err(format!("entry `{}` has no end", entries.last().map_or("", |e| e.name.as_str())));
    }
    if !declared {
        return Err("the PTX has no `.address_size` line to declare the table after".into());
    }
    Ok(Instrumented { ptx: out, entries })
}

/// The table before a step: every minimum at `u64::MAX`, the rest zero.
pub fn initial_table() -> Vec<u8> {
    let mut t = vec![0u8; TABLE_BYTES];
    for r in t.chunks_exact_mut(RECORD) {
        r[FIRST_START..FIRST_START + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        r[FIRST_RELEASE..FIRST_RELEASE + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    }
    t
}

/// One launch as the table saw it: `%globaltimer` nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchTrace {
    pub gridid: u64,
    /// Index into [`Instrumented::entries`].
    pub entry: u32,
    /// Blocks that returned.
    pub blocks: u32,
    /// The first block's start, the first and last release from the grid wait, the last
    /// block's end.
    pub first_start: u64,
    pub first_release: u64,
    pub last_release: u64,
    pub last_end: u64,
    /// Releases stamped (a block's, once it waited), and the sums (mod 2^64) of the release and
    /// end times.
    pub releases: u32,
    pub sum_release: u64,
    pub sum_end: u64,
    /// Per mark (`n - 1`): the sum (mod 2^64) of the times blocks passed it, and how many did.
    pub mark_sums: [u64; MARKS],
    pub mark_counts: [u32; MARKS],
}

impl LaunchTrace {
    /// The mean of the blocks' runs, release to end, nanoseconds: where every block that ended
    /// was released once (else the sums do not pair up).
    pub fn mean_block_run_ns(&self) -> Option<f64> {
        (self.blocks > 0 && self.releases == self.blocks).then(|| self.sum_end.wrapping_sub(self.sum_release) as f64 / self.blocks as f64)
    }

    /// The mean over the blocks of the time from their release to mark `n`, nanoseconds: where
    /// every released block passed the mark once (else the sums do not pair up).
    pub fn mean_mark_ns(&self, n: usize) -> Option<f64> {
        let (sum, count) = (self.mark_sums[n - 1], self.mark_counts[n - 1]);
        (self.releases > 0 && count == self.releases).then(|| sum.wrapping_sub(self.sum_release) as f64 / count as f64)
    }
}

fn u64_at(r: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(r[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(r: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(r[at..at + 4].try_into().expect("4 bytes"))
}

/// The launches a table holds (the records of blocks that returned), in `%gridid` order.
/// Refused where two launches stamped one slot (their gridids differ), or a record's stamps are
/// out of order (a block that returned before it started or was released).
pub fn launches(table: &[u8]) -> Result<Vec<LaunchTrace>, String> {
    if table.len() != TABLE_BYTES {
        return Err(format!("a timeline table of {} bytes, {TABLE_BYTES} expected", table.len()));
    }
    let mut out = Vec::new();
    for (slot, records) in table.chunks_exact(LANES * RECORD).enumerate() {
        let mut launch: Option<LaunchTrace> = None;
        for r in records.chunks_exact(RECORD).filter(|r| u32_at(r, BLOCKS) > 0) {
            let this = LaunchTrace {
                gridid: u64_at(r, GRIDID),
                entry: u32_at(r, ENTRY),
                blocks: u32_at(r, BLOCKS),
                first_start: u64_at(r, FIRST_START),
                first_release: u64_at(r, FIRST_RELEASE),
                last_release: u64_at(r, LAST_RELEASE),
                last_end: u64_at(r, LAST_END),
                releases: u32_at(r, RELEASES),
                sum_release: u64_at(r, SUM_RELEASE),
                sum_end: u64_at(r, SUM_END),
                mark_sums: core::array::from_fn(|m| u64_at(r, MARK_SUM + 8 * m)),
                mark_counts: core::array::from_fn(|m| u32_at(r, MARK_COUNT + 4 * m)),
            };
            if !(this.first_start <= this.first_release && this.first_release <= this.last_release && this.last_release <= this.last_end) {
                return Err(format!("slot {slot}: stamps out of order ({this:?})"));
            }
            launch = Some(match launch {
                None => this,
                Some(l) if l.gridid != this.gridid || l.entry != this.entry => {
                    return Err(format!(
                        "slot {slot} holds two launches (gridid {} and {}): more than {SLOTS} launches, or %gridid is not one number a launch",
                        l.gridid, this.gridid
                    ))
                }
                Some(l) => LaunchTrace {
                    blocks: l.blocks + this.blocks,
                    first_start: l.first_start.min(this.first_start),
                    first_release: l.first_release.min(this.first_release),
                    last_release: l.last_release.max(this.last_release),
                    last_end: l.last_end.max(this.last_end),
                    releases: l.releases + this.releases,
                    sum_release: l.sum_release.wrapping_add(this.sum_release),
                    sum_end: l.sum_end.wrapping_add(this.sum_end),
                    mark_sums: core::array::from_fn(|m| l.mark_sums[m].wrapping_add(this.mark_sums[m])),
                    mark_counts: core::array::from_fn(|m| l.mark_counts[m] + this.mark_counts[m]),
                    ..l
                },
            });
        }
        out.extend(launch);
    }
    out.sort_by_key(|l| l.gridid);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PTX module shaped as LLVM writes it: a device function with its own `ret`, an entry
    /// that waits and returns twice, one without a wait.
    const MODULE: &str = "\
.version 7.8
.target sm_90
.address_size 64

.func helper()
{
\tret;
}
.visible .entry first(
\t.param .u64 first_param_0
)
.maxntid 256, 1, 1
{
\t.reg .pred \t%p<2>;
\t.reg .b32 \t%r<4>;

// %bb.0:
\t// begin inline asm
\tgriddepcontrol.wait;
griddepcontrol.launch_dependents;
\t// end inline asm
\t@%p1 bra \t$L__BB0_2;
\t// begin inline asm
\t// strata-trace-mark 2 staged
\t// end inline asm
\tret;
$L__BB0_2:
\t// begin inline asm
\t// strata-trace-mark 2 staged
\t// end inline asm
\t{ // callseq 0, 0
\tcall.uni helper, ();
\t} // callseq 0
\tret;

}
.visible .entry second(
\t.param .u32 second_param_0
)
{
\t.reg .b32 \t%r<2>;
\tmov.u32 \t%r1, %tid.x;
\tret;

}
";

    fn count(s: &str, pat: &str) -> usize {
        s.matches(pat).count()
    }

    #[test]
    fn every_entry_stamps_its_start_each_release_and_each_return() {
        let i = instrument(MODULE).expect("instruments");
        assert_eq!(i.entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["first", "second"]);
        let body = |name: &str| {
            let at = i.ptx.find(&format!(".visible .entry {name}(")).expect("entry kept");
            let rest = &i.ptx[at..];
            rest[..rest.find("\n}\n").expect("body ends")].to_string()
        };
        let (first, second) = (body("first"), body("second"));
        // Start: once per entry, with its own index, before its first instruction.
        assert_eq!(count(&first, "st.global.u32 \t[%trace_d1+44], 0;"), 1);
        assert_eq!(count(&second, "st.global.u32 \t[%trace_d1+44], 1;"), 1);
        assert!(first.find("+44], 0;").expect("start") < first.find("// %bb.0:").expect("first block"));
        assert!(second.find("+44], 1;").expect("start") < second.find("mov.u32 \t%r1").expect("first instruction"));
        // Release: after the wait only; end: before each of the entry's returns.
        assert_eq!(count(&first, "red.global.max.u64 \t[%trace_d1+24]"), 1);
        assert!(first.find("griddepcontrol.launch_dependents;").unwrap() < first.find("[%trace_d1+16]").unwrap());
        let alone = instrument(&MODULE.replace("griddepcontrol.launch_dependents;\n", "")).expect("instruments");
        let wait = &alone.ptx[alone.ptx.find("griddepcontrol.wait;\n").expect("wait kept")..];
        assert!(wait.lines().nth(1).expect("a line after").contains("%tid.x"), "a wait alone: the release stamp right after it");
        assert_eq!(count(&second, "[%trace_d1+16]"), 0);
        assert_eq!(count(&first, "red.global.add.u32 \t[%trace_d1+40], 1;"), 2);
        assert_eq!((count(&first, "red.global.add.u64 \t[%trace_d1+48]"), count(&first, "red.global.add.u32 \t[%trace_d1+64], 1;")), (1, 1));
        assert_eq!(count(&first, "red.global.add.u64 \t[%trace_d1+56]"), 2);
        assert_eq!(count(&second, "red.global.add.u32 \t[%trace_d1+40], 1;"), 1);
        for body in [&first, &second] {
            for (at, _) in body.match_indices("\tret;") {
                let before = &body[..at];
                let stamp = before.rfind("red.global.add.u32").expect("a stamp before every ret");
                assert!(!before[stamp..].contains("bra \t$L__BB"), "the stamp sits right before its ret");
            }
        }
        // The device function's return is not a kernel's end; the registers are declared once
        // an entry, the table once a module, right after `.address_size`.
        let helper = &i.ptx[i.ptx.find(".func helper()").unwrap()..i.ptx.find(".visible .entry first").unwrap()];
        assert!(!helper.contains("trace"));
        assert_eq!(count(&i.ptx, ".reg .b64 \t%trace_d<3>;"), 2);
        assert_eq!(count(&i.ptx, &format!(".b8 {SYMBOL}[{TABLE_BYTES}];")), 1);
        assert!(i.ptx.contains(&format!(".address_size 64\n.visible .global .align 8 .b8 {SYMBOL}[")));
        // Every label a stamp branches to is defined once.
        let stamps = count(&i.ptx, "@%trace_p0 bra");
        assert_eq!(stamps, 2 + 1 + 3 + 2, "starts, the release, the ends, the marks");
        for l in 0..stamps {
            assert_eq!(count(&i.ptx, &format!("$L__trace_{l}:\n")), 1, "label {l}");
        }
        // A mark: a stamp after each of its comments, named for its entry.
        assert_eq!(count(&first, "red.global.add.u64 \t[%trace_d1+80]"), 2);
        assert_eq!(count(&first, "red.global.add.u32 \t[%trace_d1+108], 1;"), 2);
        assert!(first.find("strata-trace-mark 2 staged").unwrap() < first.find("[%trace_d1+80]").unwrap());
        assert_eq!(i.entries.iter().map(|e| e.marks.clone()).collect::<Vec<_>>(), [[None, Some("staged".to_string()), None, None], Default::default()]);
        // Nothing of the original text is lost.
        let kept = |t: &str| t.lines().filter(|l| !l.contains("%trace_") && !l.contains("$L__trace_") && !l.contains(SYMBOL)).map(String::from).collect::<Vec<_>>();
        assert_eq!(kept(&i.ptx), kept(MODULE));
    }

    #[test]
    fn refuses_what_it_cannot_stamp() {
        let predicated = MODULE.replacen("\tret;\n$L__BB0_2", "\t@%p1 ret;\n$L__BB0_2", 1);
        assert!(instrument(&predicated).unwrap_err().contains("returns with `@%p1 ret;`"));
        assert!(instrument(&MODULE.replacen("\tret;\n$L__BB0_2", "\tret.uni;\n$L__BB0_2", 1)).unwrap_err().contains("ret.uni"));
        let no_ret = MODULE.replace("\tmov.u32 \t%r1, %tid.x;\n\tret;\n", "\tmov.u32 \t%r1, %tid.x;\n");
        assert!(instrument(&no_ret).unwrap_err().contains("entry `second` has no `ret;`"));
        assert!(instrument(&MODULE.replace(".address_size 64\n", "")).unwrap_err().contains(".address_size"));
        assert!(instrument(&MODULE.replace("first_param_0", "strata_trace")).unwrap_err().contains("already"));
        let unended = &MODULE[..MODULE.rfind("\n}\n").unwrap()];
        assert!(instrument(unended).unwrap_err().contains("no end"));
        for (mark, says) in [("5 late", "is not a mark 1..=4"), ("0 early", "is not a mark"), ("2", "is not a mark"), ("2 other", "mark 2 is named `other` and `staged`")] {
            let bad = MODULE.replacen("strata-trace-mark 2 staged", &format!("strata-trace-mark {mark}"), 1);
            assert!(instrument(&bad).unwrap_err().contains(says), "{mark}");
        }
        let outside = MODULE.replace(".func helper()\n{\n", ".func helper()\n{\n\t// strata-trace-mark 1 helper\n");
        assert!(instrument(&outside).unwrap_err().contains("outside an entry"));
    }

    /// Writes a record as the stamps would.
    fn put(t: &mut [u8], slot: usize, lane: usize, l: LaunchTrace) {
        let r = &mut t[(slot * LANES + lane) * RECORD..][..RECORD];
        r[GRIDID..GRIDID + 8].copy_from_slice(&l.gridid.to_le_bytes());
        r[ENTRY..ENTRY + 4].copy_from_slice(&l.entry.to_le_bytes());
        r[BLOCKS..BLOCKS + 4].copy_from_slice(&l.blocks.to_le_bytes());
        r[FIRST_START..FIRST_START + 8].copy_from_slice(&l.first_start.to_le_bytes());
        r[FIRST_RELEASE..FIRST_RELEASE + 8].copy_from_slice(&l.first_release.to_le_bytes());
        r[LAST_RELEASE..LAST_RELEASE + 8].copy_from_slice(&l.last_release.to_le_bytes());
        r[LAST_END..LAST_END + 8].copy_from_slice(&l.last_end.to_le_bytes());
        r[RELEASES..RELEASES + 4].copy_from_slice(&l.releases.to_le_bytes());
        r[SUM_RELEASE..SUM_RELEASE + 8].copy_from_slice(&l.sum_release.to_le_bytes());
        r[SUM_END..SUM_END + 8].copy_from_slice(&l.sum_end.to_le_bytes());
        for m in 0..MARKS {
            r[MARK_SUM + 8 * m..][..8].copy_from_slice(&l.mark_sums[m].to_le_bytes());
            r[MARK_COUNT + 4 * m..][..4].copy_from_slice(&l.mark_counts[m].to_le_bytes());
        }
    }

    #[test]
    fn a_launch_is_its_records_reduced_in_gridid_order() {
        let mut t = initial_table();
        assert!(launches(&t).unwrap().is_empty(), "an untouched table holds no launch");
        let l = |gridid, entry, blocks, s, r0, r1, e| LaunchTrace {
            gridid,
            entry,
            blocks,
            first_start: s,
            first_release: r0,
            last_release: r1,
            last_end: e,
            releases: 0,
            sum_release: 0,
            sum_end: 0,
            mark_sums: [0; MARKS],
            mark_counts: [0; MARKS],
        };
        // Launch 4097 (slot 1) in two lanes, the first's sums wrapped past 2^64 (its blocks ran
        // 700 ns together, the other lane's 500); launch 2050 (slot 2) in one; 2047 (the last
        // slot), never released: gridid order is not slot order.
        let wrapped = u64::MAX - 99;
        // Mark 1: every block of launch 4097 passed it, 40 ns after its release on average;
        // mark 3: one block of the four in lane 31 did not.
        let (s0, c0) = ([wrapped.wrapping_add(200), 0, wrapped.wrapping_add(300), 0], [5, 0, 5, 0]);
        let (s31, c31) = ([1_160, 0, 1_100, 0], [4, 0, 3, 0]);
        put(&mut t, 1, 0, LaunchTrace { releases: 5, sum_release: wrapped, sum_end: wrapped.wrapping_add(700), mark_sums: s0, mark_counts: c0, ..l(4097, 3, 5, 100, 150, 160, 300) });
        put(&mut t, 1, 31, LaunchTrace { releases: 4, sum_release: 1_000, sum_end: 1_500, mark_sums: s31, mark_counts: c31, ..l(4097, 3, 4, 90, 155, 170, 280) });
        put(&mut t, 2, 7, LaunchTrace { releases: 1, sum_release: 20, sum_end: 30, ..l(2050, 1, 1, 10, 20, 20, 30) });
        put(&mut t, SLOTS - 1, 0, l(2047, 0, 2, 1, 2, 3, 4));
        let got = launches(&t).unwrap();
        let merged = LaunchTrace {
            releases: 9,
            sum_release: wrapped.wrapping_add(1_000),
            sum_end: wrapped.wrapping_add(2_200),
            mark_sums: [wrapped.wrapping_add(1_360), 0, wrapped.wrapping_add(1_400), 0],
            mark_counts: [9, 0, 8, 0],
            ..l(4097, 3, 9, 90, 150, 170, 300)
        };
        assert_eq!(got, [l(2047, 0, 2, 1, 2, 3, 4), LaunchTrace { releases: 1, sum_release: 20, sum_end: 30, ..l(2050, 1, 1, 10, 20, 20, 30) }, merged]);
        assert_eq!(got.iter().map(LaunchTrace::mean_block_run_ns).collect::<Vec<_>>(), [None, Some(10.0), Some(1_200.0 / 9.0)]);
        assert_eq!((1..=MARKS).map(|n| got[2].mean_mark_ns(n)).collect::<Vec<_>>(), [Some(40.0), None, None, None]);
        // Two launches in one slot, or a block that ended before its release, are refused.
        let mut clash = t.clone();
        put(&mut clash, 1, 5, l(4097 + SLOTS as u64, 3, 1, 95, 150, 150, 200));
        assert!(launches(&clash).unwrap_err().contains("two launches"));
        let mut disordered = t.clone();
        put(&mut disordered, 9, 0, l(9, 0, 1, 10, 30, 30, 20));
        assert!(launches(&disordered).unwrap_err().contains("out of order"));
        assert!(launches(&t[1..]).is_err());
    }
}
