package gpu

import (
	"strings"
	"testing"
)

func TestParseEmuBackend(t *testing.T) {
	tests := []struct {
		arg string
		env []string
		dir string
		err string
	}{
		{"", nil, "build/emu", ""},
		{"arch=sm_120,cp-async=early,order=reverse,sms=8,dir=/m", []string{"KCHECK_EMU_ARCH=sm_120", "KCHECK_EMU_CP_ASYNC=early", "KCHECK_EMU_ORDER=reverse", "KCHECK_EMU_SMS=8"}, "/m", ""},
		{"arch=sm_75", nil, "", `unknown option "arch=sm_75"`},
		{"cp-async=never", nil, "", `unknown option "cp-async=never"`},
		{"timeout=0s", nil, "", "positive duration"},
		{"sanitize", nil, "", `unknown option "sanitize"`},
	}
	for _, tc := range tests {
		b, err := ParseEmuBackend(tc.arg)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.arg, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.arg, err)
			continue
		}
		if b.Name() != "cuda-emu" || !b.Emulated() || b.Worker.PTXDir != tc.dir || strings.Join(b.Worker.Env, " ") != strings.Join(tc.env, " ") {
			t.Errorf("%q: name %s, dir %s, env %v; want cuda-emu, %s, %v", tc.arg, b.Name(), b.Worker.PTXDir, b.Worker.Env, tc.dir, tc.env)
		}
	}
	if b, _ := ParseBackend(""); b.Emulated() || b.Name() != "cuda" {
		t.Errorf("the cuda backend calls itself %s (emulated %v)", b.Name(), b.Emulated())
	}
}
