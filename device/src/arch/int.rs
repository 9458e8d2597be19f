//! Integer SIMD-within-a-register operations, and [`opaque`].
#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

/// `x`, through a register move the optimizer cannot see through. With its known bits lost, a
/// sum of it and a constant stays a sum, which ptxas folds into a load's address offset (given
/// a value it knew to be small, LLVM turned `x + 16` into `x | 16`: one more address computation
/// per load).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn opaque(x: u32) -> u32 {
    let r: u32;
    // SAFETY: a register move.
    unsafe { asm!("mov.b32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(nostack, pure, nomem, preserves_flags)) };
    r
}

/// 0, computed from `x` so that the optimizer cannot tell. An expression with it added depends
/// on `x`: in a loop over `x` it is computed where it is used, each turn, instead of being
/// hoisted out of the loop and held in registers across it (the lean attention entry fits its
/// 64 registers without spills that way).
#[inline(always)]
pub fn zero_in(x: u32) -> u32 {
    opaque(x) ^ x
}

/// `c + sum of the four signed byte products of a and b` (`dp4a.s32.s32`).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn dp4a(a: u32, b: u32, c: i32) -> i32 {
    let r: i32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("dp4a.s32.s32 {r}, {a}, {b}, {c};",
             r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c,
             options(nostack, pure, nomem))
    };
    r
}

/// `c + sum of the four products of a's unsigned bytes and b's signed bytes`
/// (`dp4a.u32.s32`).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn dp4a_us(a: u32, b: u32, c: i32) -> i32 {
    let r: i32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("dp4a.u32.s32 {r}, {a}, {b}, {c};",
             r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c,
             options(nostack, pure, nomem))
    };
    r
}

/// Byte permute (`prmt.b32`): result byte i is byte `(sel >> 4i) & 7` of the 8-byte value
/// `hi:lo`, or with bit 3 of that selector nibble set, that byte's bit 7 replicated (0x00 or
/// 0xff).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn prmt(lo: u32, hi: u32, sel: u32) -> u32 {
    let r: u32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("prmt.b32 {r}, {a}, {b}, {s};",
             r = out(reg32) r, a = in(reg32) lo, b = in(reg32) hi, s = in(reg32) sel,
             options(nostack, pure, nomem))
    };
    r
}

/// `(a & b) | c` as one `lop3.b32`: where `b` and `c` are both constants, the compiler's own
/// form is an AND and an OR (a logic op takes one immediate); this one keeps a constant in a
/// register instead.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn and_or(a: u32, b: u32, c: u32) -> u32 {
    let r: u32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("lop3.b32 {r}, {a}, {b}, {c}, 0xea;",
             r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c,
             options(nostack, pure, nomem))
    };
    r
}

// The simulator's (`super::sim`).
#[cfg(not(target_arch = "nvptx64"))]
pub fn and_or(a: u32, b: u32, c: u32) -> u32 {
    (a & b) | c
}

#[cfg(not(target_arch = "nvptx64"))]
pub fn opaque(x: u32) -> u32 {
    core::hint::black_box(x)
}

#[cfg(not(target_arch = "nvptx64"))]
pub fn dp4a(a: u32, b: u32, c: i32) -> i32 {
    (0..4).fold(c, |acc, i| acc.wrapping_add((a >> (8 * i)) as u8 as i8 as i32 * ((b >> (8 * i)) as u8 as i8 as i32)))
}

#[cfg(not(target_arch = "nvptx64"))]
pub fn dp4a_us(a: u32, b: u32, c: i32) -> i32 {
    (0..4).fold(c, |acc, i| acc.wrapping_add((a >> (8 * i)) as u8 as i32 * ((b >> (8 * i)) as u8 as i8 as i32)))
}

#[cfg(not(target_arch = "nvptx64"))]
pub fn prmt(lo: u32, hi: u32, sel: u32) -> u32 {
    let bytes = ((hi as u64) << 32 | lo as u64).to_le_bytes();
    (0..4).fold(0, |r, i| {
        let nibble = (sel >> (4 * i)) & 15;
        let b = bytes[(nibble & 7) as usize];
        let b = if nibble & 8 != 0 { ((b as i8) >> 7) as u8 } else { b };
        r | (b as u32) << (8 * i)
    })
}
