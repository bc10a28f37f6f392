//! The per-probe stub a jump probe jumps to (pure: the bytes, built for an address).
//!
//! A stub steps over the red zone, leaves an opaque context word (the probe point) on the
//! stack and calls the common save/restore code, whose address it holds after its code: the
//! common code saves the registers into a `struct pt_regs`, runs the handlers and returns to
//! the stub's body, the relocated displaced instructions, which jump back to the function.
//! The x86 layer knows neither the probe table nor the handlers: the caller passes the
//! context word and the common code's address as plain values.
//!
//! A stub may also have a **counting entry** ([`InlineCount`]), placed after its body: code
//! that adds one to a counter in the thread's own block and runs the body, with no register
//! frame and no call. It uses only instructions that leave the flags alone (`lea`, `mov`,
//! `push`/`pop`, `jrcxz`), keeps %rax and %rcx on the stack below the red zone it steps over,
//! and takes no locked instruction: only the thread itself writes its block. Two words decide
//! whether it counts: the probe's (the counter's byte offset in a block, 0 when the probe's
//! handlers must run) and the thread's, at a fixed offset from `%fs` (its block, 0 when it has
//! none or must not count now); either 0 sends the hit to the stub's head, the common path.
//!
//! A stub may also have a **quick entry** ([`Entries`]'s `quick`): the head's frame (the red
//! zone stepped over, the context word) and a call through a second word after the code to a
//! front-end's quick code instead of the common code, which returns to the body as the
//! common code does; or the same with a jump instead of the call (no address to resume at),
//! for quick code that goes on to the body, or to the stub's head, itself.

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, FlowControl, Instruction, InstructionBlock, MemoryOperand, Register,
};

use crate::insn::frame::STUB_FRAME;
use crate::insn::jump::{JumpPlan, NoJump};

/// Bytes reserved for one stub.
pub const STUB_SIZE: usize = 256;

/// Where the relocated instructions start in a stub (after `stub_head`).
pub const BODY_OFFSET: usize = 31;

/// The fixed head of every stub: step over the red zone, leave the context word on the stack
/// (the frame `frame::STUB_FRAME` describes), and call the common save/restore code through a
/// pointer stored after the stub.
fn stub_head(pp: u64) -> Vec<u8> {
    let mut head = vec![0x48, 0x8d, 0xa4, 0x24]; // lea -STUB_FRAME(%rsp),%rsp
    head.extend((-(STUB_FRAME as i32)).to_le_bytes());
    head.push(0x50); // push %rax
    head.extend([0x48, 0xb8]); // movabs $pp,%rax
    head.extend(pp.to_le_bytes());
    head.extend([0x48, 0x89, 0x44, 0x24, 0x08]); // mov %rax,0x8(%rsp): the frame's lowest word
    head.push(0x58); // pop %rax
    head.extend([0xff, 0x15, 0, 0, 0, 0]); // call *disp32(%rip), patched below
    head
}

/// What a counting entry reads: the address of the probe's word (the counter's byte offset
/// in a thread's block, or 0), and where the thread's word (its block's address, or 0) lies
/// from the thread pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InlineCount {
    pub probe_word: u64,
    pub thread_word: i32,
}

/// The entries a stub may have besides its head (each left out when it does not fit): a
/// counting entry reading `count`'s words, a quick entry going to quick code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entries {
    pub count: Option<InlineCount>,
    pub quick: Option<Quick>,
}

/// Where a stub's quick entry goes: the address of the quick code, called (the head's way)
/// or jumped to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quick {
    pub code: u64,
    pub call: bool,
}

/// A built stub: its bytes, and where its counting and quick entries start in them, if it
/// has them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stub {
    pub code: Vec<u8>,
    pub count_entry: Option<usize>,
    pub quick_entry: Option<usize>,
}

/// The counting entry at offset `at` of a stub whose body starts at `BODY_OFFSET`: counts
/// (see the module doc) and jumps to the body, or jumps to the head (offset 0) when either
/// word is 0, with every register and the stack pointer as the probe found them.
fn counting_entry(count: InlineCount, at: usize) -> Vec<u8> {
    let mut c = vec![0x48, 0x8d, 0x64, 0x24, 0x80]; // lea -0x80(%rsp),%rsp: over the red zone
    c.extend([0x50, 0x51]); // push %rax; push %rcx
    c.extend([0x48, 0xa1]); // movabs probe_word,%rax
    c.extend(count.probe_word.to_le_bytes());
    c.extend([0x48, 0x89, 0xc1]); // mov %rax,%rcx
    let first_check = c.len();
    c.extend([0xe3, 0]); // jrcxz miss, patched below
    c.extend([0x64, 0x48, 0x8b, 0x0c, 0x25]); // mov %fs:thread_word,%rcx
    c.extend(count.thread_word.to_le_bytes());
    let second_check = c.len();
    c.extend([0xe3, 0]); // jrcxz miss
    c.extend([0x48, 0x8d, 0x0c, 0x01]); // lea (%rcx,%rax,1),%rcx: the counter
    c.extend([0x48, 0x8b, 0x01]); // mov (%rcx),%rax
    c.extend([0x48, 0x8d, 0x40, 0x01]); // lea 0x1(%rax),%rax
    c.extend([0x48, 0x89, 0x01]); // mov %rax,(%rcx)
    c.extend(RESTORE);
    c.push(0xe9); // jmp body
    let to_body = BODY_OFFSET as i64 - (at + c.len() + 4) as i64;
    c.extend((to_body as i32).to_le_bytes());
    let miss = c.len();
    for check in [first_check, second_check] {
        c[check + 1] = (miss - (check + 2)) as u8;
    }
    c.extend(RESTORE);
    c.push(0xe9); // jmp head
    let to_head = -((at + c.len() + 4) as i64);
    c.extend((to_head as i32).to_le_bytes());
    c
}

/// pop %rcx; pop %rax; lea 0x80(%rsp),%rsp: what a counting entry leaves with.
const RESTORE: [u8; 10] = [0x59, 0x58, 0x48, 0x8d, 0xa4, 0x24, 0x80, 0, 0, 0];

/// The quick entry of a stub: the head, its `call *disp32(%rip)` made a `jmp *disp32(%rip)`
/// unless `call` (the displacement patched by the caller, as the head's), then with a call a
/// jump to the body, where the call returns.
fn quick_entry(pp: u64, call: bool, at: usize) -> Vec<u8> {
    let mut c = stub_head(pp);
    if call {
        c.push(0xe9); // jmp body
        let to_body = BODY_OFFSET as i64 - (at + c.len() + 4) as i64;
        c.extend((to_body as i32).to_le_bytes());
    } else {
        let at = c.len() - 5;
        c[at] = 0x25; // ff 15: call; ff 25: jmp
    }
    c
}

/// Writes into `code` the displacement of the `call`/`jmp *disp32(%rip)` that ends at
/// `call_end`, to the word at `word` (offsets in the stub).
fn aim_call(code: &mut [u8], call_end: usize, word: usize) {
    let disp = (word as i64 - call_end as i64) as i32;
    code[call_end - 4..call_end].copy_from_slice(&disp.to_le_bytes());
}

/// The stub at `stub` with context word `pp`: head, relocated covered instructions, the jump
/// back to the end of the patched bytes, the `entries` that fit, and the address of `common`
/// (then of the quick code).
pub fn build_stub(plan: &JumpPlan, stub: u64, pp: u64, common: u64, entries: Entries) -> Result<Stub, NoJump> {
    let Entries { count, quick } = entries;
    let mut code = stub_head(pp);
    let body_ip = stub + code.len() as u64;
    let err = |e: iced_x86::IcedError| NoJump::Stub(e.to_string());
    let resume = plan.covered[0].ip() + plan.patch_len as u64;
    let mut body = Vec::new();
    for insn in &plan.covered {
        if insn.is_call_near() {
            // The call's return address is the original one, so the callee returns into the
            // program and unwinders see the real caller.
            let ret = insn.next_ip();
            body.push(
                Instruction::with2(Code::Lea_r64_m, Register::RSP, MemoryOperand::with_base_displ(Register::RSP, -8))
                    .map_err(err)?,
            );
            body.push(
                Instruction::with2(Code::Mov_rm32_imm32, MemoryOperand::with_base(Register::RSP), ret as u32)
                    .map_err(err)?,
            );
            body.push(
                Instruction::with2(
                    Code::Mov_rm32_imm32,
                    MemoryOperand::with_base_displ(Register::RSP, 4),
                    (ret >> 32) as u32,
                )
                .map_err(err)?,
            );
            body.push(Instruction::with_branch(Code::Jmp_rel32_64, insn.near_branch_target()).map_err(err)?);
        } else {
            body.push(*insn);
        }
    }
    let last = plan.covered.last().expect("a plan covers at least one instruction");
    if !(last.is_call_near() || matches!(last.flow_control(), FlowControl::Return | FlowControl::UnconditionalBranch)) {
        body.push(Instruction::with_branch(Code::Jmp_rel32_64, resume).map_err(err)?);
    }
    let encoded = BlockEncoder::encode(64, InstructionBlock::new(&body, body_ip), BlockEncoderOptions::NONE)
        .map_err(|e| NoJump::Unrelocatable { at: plan.covered[0].ip(), why: e.to_string() })?;
    code.extend(encoded.code_buffer);
    let count_entry = count
        .map(|count| (code.len(), counting_entry(count, code.len())))
        .filter(|(at, entry)| (at + entry.len()).next_multiple_of(8) + 8 <= STUB_SIZE)
        .map(|(at, entry)| {
            code.extend(entry);
            at
        });
    let quick_entry = quick
        .map(|q| (code.len(), quick_entry(pp, q.call, code.len())))
        .filter(|(at, entry)| (at + entry.len()).next_multiple_of(8) + 16 <= STUB_SIZE)
        .map(|(at, entry)| {
            code.extend(entry);
            at
        });
    while !code.len().is_multiple_of(8) {
        code.push(0xcc);
    }
    let data = code.len();
    aim_call(&mut code, BODY_OFFSET, data);
    code.extend(common.to_le_bytes());
    if let (Some(at), Some(quick)) = (quick_entry, quick) {
        aim_call(&mut code, at + BODY_OFFSET, data + 8);
        code.extend(quick.code.to_le_bytes());
    }
    if code.len() > STUB_SIZE {
        return Err(NoJump::Stub(format!("{} bytes, more than a stub holds", code.len())));
    }
    Ok(Stub { code, count_entry, quick_entry })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::insn::decode::decode_at;
    use crate::insn::jump::{patch_bytes, plan};
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};

    const AT: u64 = 0x40_1000;

    #[test]
    fn body_offset_matches_the_head() {
        assert_eq!(stub_head(0).len(), BODY_OFFSET);
    }

    #[test]
    fn the_head_builds_the_frame_the_common_code_reads() {
        use crate::insn::frame::{CONTEXT_SLOT, JUMP_CALLER_RSP, RESUME_SLOT};
        let head = stub_head(0x1122_3344_5566_7788);
        let mut decoder = Decoder::with_ip(64, &head, AT, DecoderOptions::NONE);
        let insns: Vec<_> = core::iter::from_fn(|| decoder.can_decode().then(|| decoder.decode())).collect();
        // The stack pointer the stub leaves below the program's, and where the word goes.
        assert_eq!(insns[0].mnemonic(), Mnemonic::Lea);
        let lowered = -(insns[0].memory_displacement64() as i64);
        assert_eq!(lowered as usize, STUB_FRAME);
        assert_eq!(insns[2].immediate64(), 0x1122_3344_5566_7788);
        assert_eq!(insns[3].memory_base(), Register::RSP);
        let context_above_rsp = insns[3].memory_displacement64() as usize; // after `push %rax`
        assert_eq!(context_above_rsp, 8);
        assert_eq!(insns[5].mnemonic(), Mnemonic::Call);
        // After the call: return address, context word, then the red zone up to the program's
        // stack pointer, which is what the common code's frame constants say.
        assert_eq!(CONTEXT_SLOT - RESUME_SLOT, 8);
        assert_eq!(JUMP_CALLER_RSP - CONTEXT_SLOT, STUB_FRAME);
    }

    #[test]
    fn stub_relocates_and_jumps_back() {
        // mov 0x100(%rip),%eax (6 bytes) at AT; the stub runs it with the same target
        let f = [0x8b, 0x05, 0x00, 0x01, 0, 0, 0xc3];
        let p = plan(&f, AT, &[]).unwrap();
        let stub = AT + 0x10_0000;
        let code = build_stub(&p, stub, 0x1234, 0x7f00_0000_0000, Entries::default()).unwrap().code;
        let head = stub_head(0x1234).len();
        let moved = decode_at(&code[head..], stub + head as u64).unwrap();
        assert_eq!(moved.ip_rel_memory_address(), AT + 6 + 0x100);
        let back = decode_at(&code[head + moved.len()..], moved.next_ip()).unwrap();
        assert_eq!(back.near_branch_target(), AT + 6);
        let call = decode_at(&code[head - 6..], stub + head as u64 - 6).unwrap();
        assert_eq!(call.mnemonic(), Mnemonic::Call);
        let slot = call.ip_rel_memory_address() - stub;
        assert_eq!(&code[slot as usize..slot as usize + 8], &0x7f00_0000_0000u64.to_le_bytes());
    }

    /// The counting entry of a stub, decoded from its start to its second `jmp`.
    fn counting_insns(code: &[u8], stub: u64, at: usize) -> Vec<iced_x86::Instruction> {
        let mut decoder = Decoder::with_ip(64, &code[at..], stub + at as u64, DecoderOptions::NONE);
        let mut insns = Vec::new();
        while insns.iter().filter(|i: &&iced_x86::Instruction| i.mnemonic() == Mnemonic::Jmp).count() < 2 {
            insns.push(decoder.decode());
        }
        insns
    }

    #[test]
    fn the_counting_entry_counts_without_flags_calls_or_locks() {
        // push %rbp; mov %rsp,%rbp; ...
        let f = [0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3];
        let p = plan(&f, AT, &[]).unwrap();
        let stub = AT + 0x2000;
        let count = InlineCount { probe_word: 0x7f12_3456_7890, thread_word: -0x78 };
        let built =
            build_stub(&p, stub, 0x1234, 0x7f00_0000_0000, Entries { count: Some(count), quick: None }).unwrap();
        let at = built.count_entry.expect("a counting entry fits");
        assert!(built.code.len() <= STUB_SIZE && at > BODY_OFFSET);
        let insns = counting_insns(&built.code, stub, at);
        let mnemonics: Vec<Mnemonic> = insns.iter().map(|i| i.mnemonic()).collect();
        use Mnemonic::*;
        assert_eq!(
            mnemonics,
            [Lea, Push, Push, Mov, Mov, Jrcxz, Mov, Jrcxz, Lea, Mov, Lea, Mov, Pop, Pop, Lea, Jmp, Pop, Pop, Lea, Jmp]
        );
        for i in &insns {
            assert_eq!(i.rflags_modified(), 0, "{:?} changes flags", i.mnemonic());
            assert!(!i.has_lock_prefix() && !i.is_call_near() && !i.is_call_near_indirect(), "{:?}", i.mnemonic());
        }
        // The red zone stepped over, both words read, the counter written once.
        assert_eq!(insns[0].memory_displacement64() as i64, -128);
        assert_eq!(insns[3].memory_displacement64(), count.probe_word);
        assert_eq!(insns[6].segment_prefix(), Register::FS);
        assert_eq!(insns[6].memory_displacement64() as i64, -0x78);
        assert_eq!(insns[14].memory_displacement64(), 128);
        // Both checks miss to the restore that goes to the head; the count goes to the body.
        let miss = insns[16].ip();
        assert_eq!((insns[5].near_branch_target(), insns[7].near_branch_target()), (miss, miss));
        assert_eq!(insns[15].near_branch_target(), stub + BODY_OFFSET as u64);
        assert_eq!(insns[19].near_branch_target(), stub);
        // Without a counting entry the stub is as before (but where its data word lies).
        let plain = build_stub(&p, stub, 0x1234, 0x7f00_0000_0000, Entries::default()).unwrap();
        assert_eq!(plain.count_entry, None);
        assert_eq!(plain.code[..BODY_OFFSET - 4], built.code[..BODY_OFFSET - 4]);
        assert_eq!(plain.code[BODY_OFFSET..at], built.code[BODY_OFFSET..at]);
    }

    #[test]
    fn the_quick_entry_builds_the_heads_frame_and_jumps_through_its_own_word() {
        // push %rbp; mov %rsp,%rbp; ...
        let f = [0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3];
        let p = plan(&f, AT, &[]).unwrap();
        let stub = AT + 0x2000;
        let count = InlineCount { probe_word: 0x7f12_3456_7890, thread_word: -0x78 };
        let (common, quick) = (0x7f00_0000_0000, 0x7f00_1234_5670);
        let entries = Entries { count: Some(count), quick: Some(Quick { code: quick, call: false }) };
        let built = build_stub(&p, stub, 0x1234, common, entries).unwrap();
        let (count_at, at) = (built.count_entry.unwrap(), built.quick_entry.expect("a quick entry fits"));
        assert!(built.code.len() <= STUB_SIZE && at > count_at);
        let code = &built.code;
        let mut decoder = Decoder::with_ip(64, &code[at..], stub + at as u64, DecoderOptions::NONE);
        let insns: Vec<_> = (0..6).map(|_| decoder.decode()).collect();
        // The head's frame, with the same context word, and no address to resume at.
        assert_eq!(code[at..at + BODY_OFFSET - 6], code[..BODY_OFFSET - 6]);
        let word = |insn: &iced_x86::Instruction| {
            let at = (insn.ip_rel_memory_address() - stub) as usize;
            u64::from_le_bytes(code[at..at + 8].try_into().unwrap())
        };
        assert_eq!(insns[5].flow_control(), FlowControl::IndirectBranch);
        assert_eq!(word(&insns[5]), quick);
        // The head still calls the common code.
        let head = decode_at(&code[BODY_OFFSET - 6..], stub + BODY_OFFSET as u64 - 6).unwrap();
        assert_eq!(head.flow_control(), FlowControl::IndirectCall);
        assert_eq!(word(&head), common);
        // Without quick code, no quick entry, and the rest as before.
        let plain = build_stub(&p, stub, 0x1234, common, Entries { count: Some(count), quick: None }).unwrap();
        assert_eq!(plain.quick_entry, None);
        assert_eq!(plain.code[..BODY_OFFSET - 4], built.code[..BODY_OFFSET - 4]);
        assert_eq!(plain.code[BODY_OFFSET..at], built.code[BODY_OFFSET..at]);
        // A quick entry that calls: the head itself, then a jump to the body.
        let entries = Entries { count: None, quick: Some(Quick { code: quick, call: true }) };
        let called = build_stub(&p, stub, 0x1234, common, entries).unwrap();
        let at = called.quick_entry.unwrap();
        let code = &called.code;
        let word = |insn: &iced_x86::Instruction| {
            let at = (insn.ip_rel_memory_address() - stub) as usize;
            u64::from_le_bytes(code[at..at + 8].try_into().unwrap())
        };
        let mut decoder = Decoder::with_ip(64, &code[at..], stub + at as u64, DecoderOptions::NONE);
        let insns: Vec<_> = (0..7).map(|_| decoder.decode()).collect();
        assert_eq!(code[at..at + BODY_OFFSET - 6], code[..BODY_OFFSET - 6]);
        assert_eq!(insns[5].flow_control(), FlowControl::IndirectCall);
        assert_eq!(word(&insns[5]), quick);
        assert_eq!(insns[6].near_branch_target(), stub + BODY_OFFSET as u64);
    }

    #[test]
    fn stub_replaces_a_final_call_keeping_the_real_return_address() {
        let f = [0x53, 0xe8, 0x10, 0, 0, 0, 0xc3];
        let p = plan(&f, AT, &[]).unwrap();
        let stub = AT + 0x1000;
        let code = build_stub(&p, stub, 1, 2, Entries::default()).unwrap().code;
        let head = stub_head(1).len();
        let mut decoder = Decoder::with_ip(64, &code[head..], stub + head as u64, DecoderOptions::NONE);
        let mnemonics: Vec<Mnemonic> = (0..5).map(|_| decoder.decode().mnemonic()).collect();
        assert_eq!(mnemonics, [Mnemonic::Push, Mnemonic::Lea, Mnemonic::Mov, Mnemonic::Mov, Mnemonic::Jmp]);
        let mut patch = vec![0; p.patch_len];
        patch_bytes(AT, stub, &mut patch);
        assert_eq!(patch.len(), 6);
        assert_eq!(decode_at(&patch, AT).unwrap().near_branch_target(), stub);
        assert_eq!(patch[5], 0xcc);
    }
}
