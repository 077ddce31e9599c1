// fiber.cpp (emulated device): see fiber.h.
#include "fiber.h"

#include <stdint.h>
#include <stdlib.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#endif
#ifdef EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace emu {

// A stack reused from an earlier fiber still carries ASan's poison of that fiber's last
// frames (redzones that no function epilogue cleared): clear it before the new fiber.
static void fresh_stack(fiber *f) {
#ifdef EMU_ASAN
    __asan_unpoison_memory_region(f->stack, f->stack_size);
#else
    (void)f;
#endif
}

#if defined(__x86_64__)
// emu_switch(void **save_sp, void *load_sp): push the callee-saved registers and the
// floating-point control words, save rsp, load the other stack, pop, return into it.
extern "C" void emu_switch(void **save_sp, void *load_sp);
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch

    .globl emu_fiber_start
    .type emu_fiber_start, @function
emu_fiber_start:
    movq %r13, %rdi
    callq *%r12
    ud2
    .size emu_fiber_start, .-emu_fiber_start
    .section .note.GNU-stack,"",@progbits
    .text
)");
extern "C" void emu_fiber_start(void);

void fiber_init(fiber *f, void (*entry)(void *), void *arg) {
    fresh_stack(f);
    // The first emu_switch into f pops this frame: control words, r15..rbp, then
    // returns into emu_fiber_start with r12 = entry, r13 = arg and rsp 16-aligned.
    uintptr_t top = ((uintptr_t)f->stack + f->stack_size) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = (uint64_t)emu_fiber_start;  // return address: rsp is 16-aligned after the ret
    *--sp = 0;                          // rbp
    *--sp = 0;                          // rbx
    *--sp = (uint64_t)entry;            // r12
    *--sp = (uint64_t)arg;              // r13
    *--sp = 0;                          // r14
    *--sp = 0;                          // r15
    uint32_t mxcsr;
    uint16_t fpcw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpcw));
    *--sp = (uint64_t)mxcsr | ((uint64_t)fpcw << 32);
    f->sp = sp;
}

static void raw_switch(fiber *from, fiber *to) { emu_switch(&from->sp, to->sp); }
#else
void fiber_init(fiber *f, void (*entry)(void *), void *arg) {
    fresh_stack(f);
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = f->stack_size;
    f->uc.uc_link = nullptr;
    makecontext(&f->uc, (void (*)())entry, 1, arg);  // one pointer argument: fine on LP64 glibc
}

static void raw_switch(fiber *from, fiber *to) { swapcontext(&from->uc, &to->uc); }
#endif

#ifdef EMU_ASAN
static void asan_target(const fiber *to, const void **bottom, size_t *size) {
    *bottom = to->stack ? to->stack : to->asan_bottom;
    *size = to->stack ? to->stack_size : to->asan_size;
}
#endif

void fiber_switch(fiber *from, fiber *to) {
#ifdef EMU_ASAN
    const void *bottom;
    size_t size;
    asan_target(to, &bottom, &size);
    __sanitizer_start_switch_fiber(&from->asan_fake, bottom, size);
    raw_switch(from, to);
    __sanitizer_finish_switch_fiber(from->asan_fake, nullptr, nullptr);
#else
    raw_switch(from, to);
#endif
}

void fiber_entered(fiber *from) {
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &from->asan_bottom, &from->asan_size);
#else
    (void)from;
#endif
}

void fiber_exit(fiber *self, fiber *to) {
#ifdef EMU_ASAN
    const void *bottom;
    size_t size;
    asan_target(to, &bottom, &size);
    __sanitizer_start_switch_fiber(nullptr, bottom, size);  // this stack's fake frames go
#endif
    raw_switch(self, to);
}

}  // namespace emu
