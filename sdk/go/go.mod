module zerohop.dev/zerohop

go 1.22
