//! The memory and string routines the compiler calls for the runtime's own code (`memcpy`,
//! `memmove`, `memset`, `memcmp`, `bcmp`, `strlen`), defined here with hidden visibility.
//!
//! Without them every struct copy and slice comparison in the runtime would call libc's, and
//! libc's functions may carry probes: the runtime would hit its own probes while placing them
//! (a trap each with `--no-optimize`) and on its hit paths. Hidden symbols bind inside this
//! library only; the program keeps calling libc's. Signal-safe: no state, no calls.

core::arch::global_asm!(
    ".pushsection .text.uprobe_memfns,\"ax\",@progbits",
    ".p2align 4",
    ".globl memcpy",
    ".hidden memcpy",
    ".type memcpy,@function",
    "memcpy:",
    "mov rax, rdi",
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
    "memset:",
    "mov r8, rdi",
    "mov eax, esi",
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
}
