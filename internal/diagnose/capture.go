package diagnose

// CaptureAttribution is the stage table of a pipeline capture.
type CaptureAttribution struct{}
