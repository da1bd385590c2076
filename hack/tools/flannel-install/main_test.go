package main

import "testing"

func TestRenderNamesTheNodeDirEverywhere(t *testing.T) {
	got := Render(`{"subnetFile":"__NODE_DIR__/flannel/subnet.env","dataDir":"__NODE_DIR__/cni/flannel"}`, "/s/nodes/ncm-n1/")
	want := `{"subnetFile":"/s/nodes/ncm-n1/flannel/subnet.env","dataDir":"/s/nodes/ncm-n1/cni/flannel"}`
	if got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}
