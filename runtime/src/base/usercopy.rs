//! Reads of memory that may not be there, as the kernel's `copy_from_user` does them: a copy
//! loop whose loads are known instructions; when one of them faults, the runtime's SIGSEGV
//! and SIGBUS handler (`hazard::signals`) asks [`fixup`] and resumes the copy at its fixup
//! label, which reports the failure. A fetcharg through a bad pointer costs the program
//! nothing but that signal, and never kills it.
//!
//! Signal-safe: no state, no calls; the copies run on the hit paths.

core::arch::global_asm!(
    ".pushsection .text.uprobe_usercopy,\"ax\",@progbits",
    ".p2align 4",
    ".globl uprobe_copy_user",
    ".hidden uprobe_copy_user",
    ".type uprobe_copy_user,@function",
    // rdi = dst, rsi = src, rdx = len; rax = bytes not copied (0: all of them).
    "uprobe_copy_user:",
    "mov rcx, rdx",
    ".globl uprobe_copy_user_load",
    ".hidden uprobe_copy_user_load",
    "uprobe_copy_user_load:",
    "rep movsb",
    "xor eax, eax",
    "ret",
    ".globl uprobe_copy_user_fixup",
    ".hidden uprobe_copy_user_fixup",
    "uprobe_copy_user_fixup:",
    "mov rax, rcx",
    "ret",
    ".size uprobe_copy_user, . - uprobe_copy_user",
    //
    ".p2align 4",
    ".globl uprobe_strncpy_user",
    ".hidden uprobe_strncpy_user",
    ".type uprobe_strncpy_user,@function",
    // rdi = dst, rsi = src, rdx = max; rax = length before the NUL, max when none came
    // within max bytes, -1 on a fault. Bytes one at a time up to an 8-byte boundary of the
    // source, then whole aligned words while 8 bytes still fit in `dst` (an aligned word
    // never crosses into another page, so it faults only where a byte of it would), then
    // bytes again. Of the word holding the NUL only the bytes before it are stored (merged
    // into the word of `dst` there): `dst` past the length returned is left as it was.
    "uprobe_strncpy_user:",
    "xor eax, eax",
    "test sil, 7",
    "jz 4f",
    "2:",
    "cmp rax, rdx",
    "je 3f",
    ".globl uprobe_strncpy_user_load",
    ".hidden uprobe_strncpy_user_load",
    "uprobe_strncpy_user_load:",
    "movzx ecx, byte ptr [rsi + rax]",
    "test ecx, ecx",
    "jz 3f",
    "mov byte ptr [rdi + rax], cl",
    "inc rax",
    "lea rcx, [rsi + rax]",
    "test cl, 7",
    "jnz 2b",
    "4:",
    "lea rcx, [rax + 8]",
    "cmp rcx, rdx",
    "ja 2b",
    ".globl uprobe_strncpy_user_load_word",
    ".hidden uprobe_strncpy_user_load_word",
    "uprobe_strncpy_user_load_word:",
    "mov r11, qword ptr [rsi + rax]",
    // The first zero byte's top bit is the lowest bit set in r10:
    // (w - 0x01..01) & !w & 0x80..80.
    "movabs r8, 0x0101010101010101",
    "mov r10, r11",
    "sub r10, r8",
    "mov rcx, r11",
    "not rcx",
    "and r10, rcx",
    "shl r8, 7",
    "and r10, r8",
    "jnz 5f",
    "mov qword ptr [rdi + rax], r11",
    "add rax, 8",
    "jmp 4b",
    // The NUL is byte k: the k bytes before it, merged under the mask (1 << 8k) - 1.
    "5:",
    "bsf rcx, r10",
    "and ecx, 0x38",
    "mov r10d, 1",
    "shl r10, cl",
    "dec r10",
    "and r11, r10",
    "not r10",
    "and r10, qword ptr [rdi + rax]",
    "or r10, r11",
    "mov qword ptr [rdi + rax], r10",
    "shr ecx, 3",
    "add rax, rcx",
    "3:",
    "ret",
    ".globl uprobe_strncpy_user_fixup",
    ".hidden uprobe_strncpy_user_fixup",
    "uprobe_strncpy_user_fixup:",
    "mov rax, -1",
    "ret",
    ".size uprobe_strncpy_user, . - uprobe_strncpy_user",
    //
    ".p2align 4",
    ".globl uprobe_load_u64_user",
    ".hidden uprobe_load_u64_user",
    ".type uprobe_load_u64_user,@function",
    // rdi = src; rax = the word, rdx = 0 when it was read, 1 on a fault (one load, the
    // result in registers: the stack walk's reads, where `rep movsb`'s start-up, or a store
    // and its reload, would cost more than the copy).
    "uprobe_load_u64_user:",
    "xor edx, edx",
    ".globl uprobe_load_u64_user_load",
    ".hidden uprobe_load_u64_user_load",
    "uprobe_load_u64_user_load:",
    "mov rax, qword ptr [rdi]",
    "ret",
    ".globl uprobe_load_u64_user_fixup",
    ".hidden uprobe_load_u64_user_fixup",
    "uprobe_load_u64_user_fixup:",
    "xor eax, eax",
    "mov edx, 1",
    "ret",
    ".size uprobe_load_u64_user, . - uprobe_load_u64_user",
    ".popsection",
);

extern "C" {
    fn uprobe_copy_user(dst: *mut u8, src: usize, len: usize) -> usize;
    fn uprobe_strncpy_user(dst: *mut u8, src: usize, max: usize) -> isize;
    fn uprobe_copy_user_load();
    fn uprobe_copy_user_fixup();
    fn uprobe_strncpy_user_load();
    fn uprobe_strncpy_user_load_word();
    fn uprobe_strncpy_user_fixup();
    fn uprobe_load_u64_user(src: usize) -> Loaded;
    fn uprobe_load_u64_user_load();
    fn uprobe_load_u64_user_fixup();
}

/// Copies `dst.len()` bytes from address `src`; false if any of them could not be read.
pub fn copy(dst: &mut [u8], src: usize) -> bool {
    if src < 4096 || src.checked_add(dst.len()).is_none() {
        return false;
    }
    // SAFETY: `dst` is writable for its length; reads of `src` that fault are caught by the
    // SIGSEGV/SIGBUS handler, which resumes at the fixup.
    unsafe { uprobe_copy_user(dst.as_mut_ptr(), src, dst.len()) == 0 }
}

/// What `uprobe_load_u64_user` gives back, in `rax` and `rdx`.
#[repr(C)]
struct Loaded {
    word: u64,
    failed: u64,
}

/// Reads the 8-byte word at `src`.
#[inline]
pub fn read_u64(src: usize) -> Option<u64> {
    if !(4096..=usize::MAX - 8).contains(&src) {
        return None;
    }
    // SAFETY: reads only; a fault of the one load is caught by the SIGSEGV/SIGBUS handler,
    // which resumes at the fixup.
    let loaded = unsafe { uprobe_load_u64_user(src) };
    (loaded.failed == 0).then_some(loaded.word)
}

/// Copies the NUL-terminated string at `src` into `dst` (without the NUL): its length, or
/// None if a byte before the NUL (or before `dst` is full) could not be read.
pub fn strncpy(dst: &mut [u8], src: usize) -> Option<usize> {
    if src < 4096 {
        return None;
    }
    // SAFETY: as in `copy`; at most `dst.len()` bytes are written.
    let n = unsafe { uprobe_strncpy_user(dst.as_mut_ptr(), src, dst.len()) };
    (n >= 0).then_some(n as usize)
}

/// Where a fault at `rip` resumes, when `rip` is one of the copy loads (signal context).
pub fn fixup(rip: usize) -> Option<usize> {
    if rip == uprobe_copy_user_load as *const () as usize {
        Some(uprobe_copy_user_fixup as *const () as usize)
    } else if rip == uprobe_strncpy_user_load as *const () as usize
        || rip == uprobe_strncpy_user_load_word as *const () as usize
    {
        Some(uprobe_strncpy_user_fixup as *const () as usize)
    } else if rip == uprobe_load_u64_user_load as *const () as usize {
        Some(uprobe_load_u64_user_fixup as *const () as usize)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mapped_memory_and_refuses_low_addresses() {
        let word = 0x1122_3344_5566_7788u64;
        assert_eq!(read_u64(&word as *const u64 as usize), Some(word));
        assert_eq!(read_u64(16), None);
        let text = b"hello\0world";
        let mut out = [0u8; 16];
        assert_eq!(strncpy(&mut out, text.as_ptr() as usize), Some(5));
        assert_eq!(&out[..5], b"hello");
        assert_eq!(strncpy(&mut out[..3], text.as_ptr() as usize), Some(3));
        assert_eq!(strncpy(&mut out, 0), None);
    }

    /// Every start alignment, length and room, through the byte and word loops alike.
    #[test]
    fn copies_strings_at_every_alignment_and_room() {
        let mut text = [b'x'; 64];
        for start in 0..8 {
            for len in 0..40 {
                text.fill(b'x');
                for (i, b) in text[start..start + len].iter_mut().enumerate() {
                    *b = b'a' + (i % 26) as u8;
                }
                text[start + len] = 0;
                for room in 0..48 {
                    let mut out = [0xeeu8; 48];
                    let n = len.min(room);
                    let got = strncpy(&mut out[..room], text[start..].as_ptr() as usize);
                    assert_eq!(got, Some(n), "start {start} len {len} room {room}");
                    assert_eq!(&out[..n], &text[start..start + n]);
                    assert!(
                        out[n..].iter().all(|&b| b == 0xee),
                        "wrote past the string: start {start} len {len} room {room}"
                    );
                }
            }
        }
    }
}
