// Package common declares the pointer helpers flannel's tencentvpc backend uses; see ../README.md.
package common

// StringPtr returns a pointer to v.
func StringPtr(v string) *string { return &v }

// StringPtrs returns pointers to each of vs.
func StringPtrs(vs []string) []*string {
	out := make([]*string, 0, len(vs))
	for i := range vs {
		out = append(out, &vs[i])
	}
	return out
}

// BoolPtr returns a pointer to v.
func BoolPtr(v bool) *bool { return &v }
