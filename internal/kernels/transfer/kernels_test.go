package transfer

// The pipeline test attends over what a transfer delivered.
import _ "github.com/kcheck-dev/kcheck/internal/kernels/mla"
