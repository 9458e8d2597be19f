//! `grid_pad`: the launch-size rule that adds a few empty blocks where a launch's waves land at,
//! or just below, a whole multiple of the device's wave slots, or just past one.
//!
//! Seen on a 32-WGP RDNA4 part (gfx1201, 2,048 wave slots): 512-thread launches of 125-128
//! blocks ran 16.4 us against 2.24 us at 118-124 and at 129-133 blocks. The rule pads:
//! - when the waves fall within the last `max(16, 4 x waves per block)` slots below (or at) a
//!   multiple `k x slots`;
//! - when they fall less than `min(16 k, 256)` waves past the k-th multiple;
//!
//! to the first block count whose waves clear the zone past that multiple. Kernels launched on a
//! padded grid return at once in the blocks past their real work.

/// What the rule needs to know of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaveSlots {
    /// Waves the whole device holds at once (e.g. 2,048 on a 32-WGP gfx1201; SMs x 64 warps
    /// on NVIDIA).
    pub slots: u32,
    /// Lanes per wave (32 on the wave32 parts Strata targets and on NVIDIA).
    pub wave: u32,
}

/// The block count to launch for `blocks` blocks of `threads` threads on `device`.
pub fn grid_pad(blocks: u32, threads: u32, device: WaveSlots) -> u32 {
    let per_block = threads.div_ceil(device.wave).max(1) as u64;
    let slots = device.slots.max(1) as u64;
    let waves = blocks as u64 * per_block;
    let below = 16.max(4 * per_block);
    // The multiple at or just above the waves, and the one just below.
    let k_up = waves.div_ceil(slots);
    let k_down = waves / slots;
    let past_zone = |k: u64| k * slots + (16 * k).min(256);
    let target = if k_up >= 1 && waves + below > k_up * slots {
        past_zone(k_up)
    } else if k_down >= 1 && waves > k_down * slots && waves < past_zone(k_down) {
        past_zone(k_down)
    } else {
        return blocks;
    };
    target.div_ceil(per_block).min(u32::MAX as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    const GFX1201: WaveSlots = WaveSlots { slots: 2048, wave: 32 };

    #[test]
    fn the_measured_rdna4_cases() {
        // 512 threads = 16 waves per block. 125..=128 blocks stalled: padded to 129.
        for b in 125..=128 {
            assert_eq!(grid_pad(b, 512, GFX1201), 129, "{b} blocks");
        }
        // 118..=124 and 129..=133 ran fast: left alone.
        for b in (118..=124).chain(129..=133) {
            assert_eq!(grid_pad(b, 512, GFX1201), b, "{b} blocks");
        }
    }

    #[test]
    fn small_blocks_pad_past_the_multiple() {
        // 64-thread blocks (2 waves): the zone below 2048 is 16 waves, the zone past it 16.
        assert_eq!(grid_pad(1016, 64, GFX1201), 1016); // 2032 waves: at the zone's edge, outside
        assert_eq!(grid_pad(1017, 64, GFX1201), 1032); // 2034 -> 2064 waves
        assert_eq!(grid_pad(1024, 64, GFX1201), 1032); // exactly 2048
        assert_eq!(grid_pad(1025, 64, GFX1201), 1032); // 2050: just past
        assert_eq!(grid_pad(1032, 64, GFX1201), 1032); // 2064: clear
        // The second multiple: 32 waves past it.
        assert_eq!(grid_pad(2049, 64, GFX1201), 2064);
        assert_eq!(grid_pad(2064, 64, GFX1201), 2064);
    }

    #[test]
    fn the_zone_past_a_multiple_is_capped_at_256_waves() {
        // k = 20: 16 k = 320, capped at 256 waves past 40,960.
        let just_past = 20 * 2048 + 1;
        assert_eq!(grid_pad(just_past, 32, GFX1201), 20 * 2048 + 256);
        assert_eq!(grid_pad(20 * 2048 + 256, 32, GFX1201), 20 * 2048 + 256);
    }

    #[test]
    fn small_launches_are_left_alone() {
        for b in 1..100 {
            assert_eq!(grid_pad(b, 256, GFX1201), b);
        }
    }
}
