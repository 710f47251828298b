//! The one way a kernel chooses its instruction set: the CPU's features, detected once, and the
//! macro that compiles a plain-loop function once per vector width and picks one at run time.

use std::sync::OnceLock;

/// What this CPU can run, as the kernels use it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cpu {
    /// AVX2 with FMA: the 256-bit paths.
    pub avx2: bool,
    /// AVX-512 F, BW and VL with FMA (and AVX2): the 512-bit paths.
    pub avx512: bool,
    /// AVX-512 VNNI (with the above): the integer products' instruction.
    pub vnni: bool,
    /// AVX-512 BF16 (with the above): the BF16 dot products of paired panels.
    pub bf16dot: bool,
    /// F16C: widening F16 weights.
    pub f16c: bool,
}

/// The CPU's features, detected on first use.
pub(crate) fn cpu() -> Cpu {
    static CPU: OnceLock<Cpu> = OnceLock::new();
    *CPU.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Cpu {
    use std::arch::is_x86_feature_detected as has;
    let avx2 = has!("avx2") && has!("fma");
    let avx512 = avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl");
    Cpu { avx2, avx512, vnni: avx512 && has!("avx512vnni"), bf16dot: avx512 && has!("avx512bf16"), f16c: has!("f16c") }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Cpu {
    Cpu { avx2: false, avx512: false, vnni: false, bf16dot: false, f16c: false }
}

/// Defines `$name` as the function `$with` compiled three times, plain, for AVX2 (with FMA) and
/// for AVX-512 (F and BW), and chosen at run time. `$with` is written in plain loops that the
/// compiler turns into vector code, so the three builds do the same operations in the same order
/// and give the same bits, in wider vectors: the compiler never fuses a multiply and an add by
/// itself, and a written `mul_add` rounds once in every build (an FMA instruction, or libm's
/// `fmaf` in the plain build).
macro_rules! compiled_for_vectors_impl {
    ($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) => $with:ident) => {
        $(#[$doc])*
        pub(super) fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            if $crate::kernel::dispatch::cpu().avx512 {
                #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
                unsafe fn avx512($($arg: $ty),*) {
                    $with($($arg),*)
                }
                // SAFETY: the CPU has AVX-512F/BW and FMA (checked above).
                return unsafe { avx512($($arg),*) };
            }
            #[cfg(target_arch = "x86_64")]
            if $crate::kernel::dispatch::cpu().avx2 {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) {
                    $with($($arg),*)
                }
                // SAFETY: the CPU has AVX2 and FMA (checked above).
                return unsafe { avx2($($arg),*) };
            }
            $with($($arg),*)
        }
    };
}

pub(crate) use compiled_for_vectors_impl as compiled_for_vectors;
