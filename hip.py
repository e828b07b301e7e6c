import ctypes, sys, os
lib = ctypes.CDLL(os.environ["TOAST_HIPRTC_LIB"])
src = open("/work/main/toast-accel/device/prelude_hip.h").read() + '\n#line 1 "kernels.h"\n' + open("/work/main/toast-accel/device/kernels.h").read()
prog = ctypes.c_void_p()
r = lib.hiprtcCreateProgram(ctypes.byref(prog), src.encode(), b"toast_kernels.hip", 0, None, None)
arch = sys.argv[1]
opts = [f"--offload-arch={arch}", "-ffp-contract=off", "-Rpass-analysis=kernel-resource-usage"]
arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
r = lib.hiprtcCompileProgram(prog, len(opts), arr)
n = ctypes.c_size_t()
lib.hiprtcGetProgramLogSize(prog, ctypes.byref(n))
buf = ctypes.create_string_buffer(n.value)
lib.hiprtcGetProgramLog(prog, buf)
print("rc", r)
print(buf.value.decode(errors="replace"))
