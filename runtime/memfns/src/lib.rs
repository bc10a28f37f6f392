//! The memory and string routines the compiler calls (`memcpy`, `memmove`, `memset`,
//! `memcmp`, `bcmp`, `strlen`), for the runtime (libuprobe.so) and for handler libraries
//! built with the SDK: [`define!`] emits them, with hidden visibility, into the library
//! that invokes it.
//!
//! Without them every struct copy and slice comparison in that library would call libc's,
//! and libc's functions may carry probes: the runtime would hit its own probes while placing
//! them (a trap each with `--no-optimize`) and on its hit paths, and a handler's set-up and
//! report code would trap on every copy under libc-wide probes. Hidden symbols bind inside
//! the library only; the program keeps calling libc's. Signal-safe: no state, no calls.
//!
//! A macro rather than functions of this crate: the symbols must be defined in the object
//! of the library that uses them, whatever the linker keeps of an rlib, and in no other
//! crate that happens to depend on this one. Only the runtime and the SDK invoke it.
#![cfg_attr(not(test), no_std)]

/// Defines hidden `memcpy`, `memmove`, `memset`, `memcmp`, `bcmp` and `strlen` (x86-64) in
/// the crate that invokes it, once, at its top level.
#[macro_export]
macro_rules! define {
    () => {
        ::core::arch::global_asm!(
            ".pushsection .text.uprobe_memfns,\"ax\",@progbits",
            ".p2align 4",
            ".globl memcpy",
            ".hidden memcpy",
            ".type memcpy,@function",
            // Up to 16 bytes (most copies: fields, short names): two overlapping loads and stores,
            // no `rep movsb`, whose start-up costs more than such a copy.
            "memcpy:",
            "mov rax, rdi",
            "cmp rdx, 16",
            "ja 7f",
            "cmp rdx, 8",
            "jb 8f",
            "mov rcx, qword ptr [rsi]",
            "mov r8, qword ptr [rsi + rdx - 8]",
            "mov qword ptr [rdi], rcx",
            "mov qword ptr [rdi + rdx - 8], r8",
            "ret",
            "8:",
            "cmp rdx, 4",
            "jb 9f",
            "mov ecx, dword ptr [rsi]",
            "mov r8d, dword ptr [rsi + rdx - 4]",
            "mov dword ptr [rdi], ecx",
            "mov dword ptr [rdi + rdx - 4], r8d",
            "ret",
            "9:",
            "test rdx, rdx",
            "jz 10f",
            "movzx ecx, byte ptr [rsi]",
            "movzx r8d, byte ptr [rsi + rdx - 1]",
            "cmp rdx, 2",
            "jbe 11f",
            "movzx r9d, byte ptr [rsi + 1]",
            "mov byte ptr [rdi + 1], r9b",
            "11:",
            "mov byte ptr [rdi], cl",
            "mov byte ptr [rdi + rdx - 1], r8b",
            "10:",
            "ret",
            "7:",
            "mov rcx, rdx",
            "rep movsb",
            "ret",
            ".size memcpy, . - memcpy",
            //
            ".p2align 4",
            ".globl memmove",
            ".hidden memmove",
            ".type memmove,@function",
            "memmove:",
            "mov rax, rdi",
            "mov rcx, rdx",
            "cmp rdi, rsi",
            "jbe 2f", // destination below the source: forwards is safe
            "lea r8, [rsi + rdx]",
            "cmp rdi, r8",
            "jae 2f", // no overlap
            "lea rsi, [rsi + rdx - 1]",
            "lea rdi, [rdi + rdx - 1]",
            "std",
            "rep movsb",
            "cld",
            "ret",
            "2:",
            "rep movsb",
            "ret",
            ".size memmove, . - memmove",
            //
            ".p2align 4",
            ".globl memset",
            ".hidden memset",
            ".type memset,@function",
            // Short fills (padding) byte by byte: `rep stosb` starts slowly.
            "memset:",
            "mov r8, rdi",
            "mov eax, esi",
            "cmp rdx, 32",
            "ja 13f",
            "test rdx, rdx",
            "jz 14f",
            "12:",
            "mov byte ptr [rdi], al",
            "inc rdi",
            "dec rdx",
            "jnz 12b",
            "14:",
            "mov rax, r8",
            "ret",
            "13:",
            "mov rcx, rdx",
            "rep stosb",
            "mov rax, r8",
            "ret",
            ".size memset, . - memset",
            //
            ".p2align 4",
            ".globl memcmp",
            ".hidden memcmp",
            ".type memcmp,@function",
            ".globl bcmp",
            ".hidden bcmp",
            ".type bcmp,@function",
            "memcmp:",
            "bcmp:",
            "xor eax, eax",
            "test rdx, rdx",
            "jz 4f",
            "3:",
            "movzx eax, byte ptr [rdi]",
            "movzx ecx, byte ptr [rsi]",
            "sub eax, ecx",
            "jnz 4f",
            "inc rdi",
            "inc rsi",
            "dec rdx",
            "jnz 3b",
            "4:",
            "ret",
            ".size memcmp, . - memcmp",
            ".size bcmp, . - bcmp",
            //
            ".p2align 4",
            ".globl strlen",
            ".hidden strlen",
            ".type strlen,@function",
            "strlen:",
            "mov rax, rdi",
            "5:",
            "cmp byte ptr [rax], 0",
            "je 6f",
            "inc rax",
            "jmp 5b",
            "6:",
            "sub rax, rdi",
            "ret",
            ".size strlen, . - strlen",
            ".popsection",
        );
    };
}

// The unit tests run with these routines defined in the test binary, as the runtime has them.
#[cfg(test)]
define!();

#[cfg(test)]
mod tests {
    #[test]
    fn copies_compare_and_fill_like_libc() {
        let mut buf: Vec<u8> = (0..200u8).collect();
        buf.copy_within(0..150, 10); // overlapping, forwards source below: memmove backwards
        assert_eq!(&buf[10..20], &(0..10u8).collect::<Vec<_>>()[..]);
        assert_eq!(buf[159], 149);
        buf.copy_within(20..200, 0);
        assert_eq!(buf[0], 10);
        let a = vec![7u8; 300];
        let mut b = a.clone();
        assert_eq!(a, b);
        b[299] = 8;
        assert!(a < b && a != b);
        b.fill(0);
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(c"hello".count_bytes(), 5);
    }

    #[test]
    fn every_short_length_copies_and_fills_exactly() {
        let src: Vec<u8> = (1..=40u8).collect();
        for len in 0..=33 {
            let mut dst = [0u8; 40];
            // A length the compiler cannot see: the call goes to memcpy.
            let n = std::hint::black_box(len);
            dst[1..1 + n].copy_from_slice(&src[..n]);
            assert_eq!(&dst[1..1 + n], &src[..n], "{len}");
            assert!(dst[0] == 0 && dst[1 + n..].iter().all(|&b| b == 0), "{len}");
            let mut fill = [0u8; 40];
            fill[1..1 + n].fill(std::hint::black_box(0xab));
            assert!(fill[1..1 + n].iter().all(|&b| b == 0xab) && fill[0] == 0 && fill[1 + n..].iter().all(|&b| b == 0));
        }
    }
}
